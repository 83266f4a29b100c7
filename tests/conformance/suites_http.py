"""The L0 suites, each a function that does what its qa/L0_*/test.sh does for the CPU
backends tritond runs (onnx, libtorch, python, python_dlpack): build the model repositories,
start the server with the test.sh flags, run the python test cases, check what test.sh checks.

Left out, per suite, with the reason printed: C++ client programs and example clients that live
in the client repository, C++ test backends, nginx, GPU/TensorRT/OpenVINO/TensorFlow models.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

BACKEND_DIR = "/opt/tritonserver/backends"


def _sed(path: Path, pattern: str, repl: str, count: int = 0, flags: int = 0) -> None:
    path.write_text(re.sub(pattern, repl, path.read_text(), count=count, flags=flags))


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def _copytree(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def _fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _note(qa, what: str) -> None:
    print(f"  (not run: {what})", flush=True)


def _curl(body: str, url: str = "http://localhost:8000/v2/models/simple/infer", timeout: float = 30) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _python_from_onnx(qa, onnx_model: Path, dest_root: Path, kind: str = "python",
                      platform_to_backend: bool = False, swap: bool = True) -> Path:
    """test.sh's onnx -> python model conversion (sed over the onnx config, add_sub/sub_add model.py)."""
    name = onnx_model.name.replace("onnx", kind)
    dest = dest_root / name
    (dest / "1").mkdir(parents=True, exist_ok=True)
    text = (onnx_model / "config.pbtxt").read_text()
    if platform_to_backend:
        text = re.sub(r"platform:.*", 'backend: "python"', text)
    else:
        text = re.sub(r"platform:.*", "", text)
        text = re.sub(r"version_policy.*", 'backend: "python"', text)
    text = text.replace("onnx", kind)
    (dest / "config.pbtxt").write_text(text)
    shutil.copy(onnx_model / "output0_labels.txt", dest)
    models = qa.qa / "python_models"
    swap = swap and any(name in (f"{kind}_{t}_{t}_{t}", f"{kind}_nobatch_{t}_{t}_{t}") for t in ("float32", "int32", "int16", "int8"))
    src = {("python", False): "add_sub", ("python", True): "sub_add",
           ("python_dlpack", False): "dlpack_add_sub", ("python_dlpack", True): "dlpack_sub_add"}[(kind, swap)]
    shutil.copy(models / src / "model.py", dest / "1")
    return dest


# ====================================================================== L0_http
def l0_http(qa) -> None:
    d = qa.qa / "L0_http"
    models = _fresh(d / "models")
    for m in ("simple", "simple_dyna_sequence", "simple_identity", "simple_sequence", "simple_string"):
        _copytree(qa.examples / m, models / m)
    _note(qa, "densenet_onnx and the image client: the model is downloaded by Triton's Dockerfile.QA")
    _note(qa, "simple_string_dyna_sequence: its backend is Triton's C++ test library libtriton_dyna_sequence.so")

    args = f"--backend-directory={BACKEND_DIR} --model-repository={models} --allow-client-shm=true"
    s = qa.start(d, args, "server.log")
    _note(qa, "example clients and C++ unit tests (client repository), http_basic_auth_test.py (nginx)")
    qa.unittest(d, "http_client_plugin_test.py", server=s)
    if s:
        s.stop()

    # Model control (simple_http_model_control.py, client repository): test.sh greps the log.
    args = f"--backend-directory={BACKEND_DIR} --model-repository={models} --model-control-mode=explicit"
    s = qa.start(d, args, "model_control.server.log")
    if s:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException
        c = httpclient.InferenceServerClient("localhost:8000")
        try:
            c.load_model("simple")
            try:
                c.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
                qa.check("model_control: malformed config refused", False, "load succeeded")
            except InferenceServerException as e:
                qa.check("model_control: malformed config refused", "failed to load" in e.message(), e.message())
            c.load_model("simple", config='{"max_batch_size":"16"}')
            qa.check("model_control: config override applied",
                     c.get_model_config("simple")["max_batch_size"] == 16, str(c.get_model_config("simple")))
            try:
                c.load_model("wrong_model_name")
                qa.check("model_control: unknown model load fails", False, "load succeeded")
            except InferenceServerException as e:
                qa.check("model_control: unknown model load fails", "failed to load" in e.message(), e.message())
        except Exception as e:      # a step that should have worked
            qa.check("model_control: sequence", False, repr(e))
        s.stop()
        qa.check("model_control: 'Invalid config override' in server log", "Invalid config override" in s.text(),
                 s.text()[-400:])
    else:
        qa.check("model_control: server start", False, "server did not start")

    # Combinations of binary and JSON data (curl in test.sh)
    s = qa.start(d, f"--model-repository={models}", "binaryjson.server.log")
    if s:
        _binary_json_checks(qa)
        s.stop()
    else:
        qa.check("binaryjson: server start", False, "server did not start")

    # python http aio unit test
    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository={models} --allow-client-shm=true",
                 "aio.server.log")
    qa.unittest(d, "python_http_aio_test.py", server=s)
    if s:
        s.stop()

    # http_test.py
    unit = _fresh(d / "python_unit_test_models")
    ident = qa.data / "qa_identity_model_repository"
    for m in ("onnx_zero_1_float32", "onnx_zero_1_object", "onnx_zero_1_float16", "onnx_zero_3_float32"):
        _copytree(ident / m, unit / m)
    _copytree(unit / "onnx_zero_1_object", unit / "onnx_zero_1_object_1_element")
    cfg = unit / "onnx_zero_1_object_1_element" / "config.pbtxt"
    _sed(cfg, "onnx_zero_1_object", "onnx_zero_1_object_1_element")
    _sed(cfg, "-1", "1", count=1)
    _copytree(unit / "onnx_zero_1_float32", unit / "onnx_zero_1_float32_queue")
    cfg = unit / "onnx_zero_1_float32_queue" / "config.pbtxt"
    _sed(cfg, "onnx_zero_1_float32", "onnx_zero_1_float32_queue")
    _append(cfg, "dynamic_batching { \n    max_queue_delay_microseconds: 1000000\n    preferred_batch_size: [ 8 ]\n"
                 "    default_queue_policy {\n        max_queue_size: 1\n    }\n}")
    _copytree(models / "simple_identity", unit / "simple_identity")
    _copytree(models / "simple_identity", unit / "simple_identity_int64")
    cfg = unit / "simple_identity_int64" / "config.pbtxt"
    _sed(cfg, "TYPE_STRING", "TYPE_INT64")
    _sed(cfg, "simple_identity", "simple_identity_int64")
    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository=python_unit_test_models "
                    f"--model-control-mode=explicit --load-model=*", "http_test.server.log")
    qa.unittest(d, "http_test.py", server=s)
    if s:
        s.stop()
    _note(qa, "generate_endpoint_test.py here: it is the suite L0_http_generate")

    # Restricted APIs: start-up refusals, then the python test
    qa.refused(d, f"--model-repository={models} --http-restricted-api=model-repository,health:k1=v1 "
                  f"--http-restricted-api=metadata,health:k2=v2", "restricted_dup.server.log",
               "api 'health' can not be specified in multiple config groups", "restricted api: repeated category")
    qa.refused(d, f"--model-repository={models} --http-restricted-api=model-reposit,health:k1=v1 "
                  f"--http-restricted-api=metadata,health:k2=v2", "restricted_unknown.server.log",
               "unknown restricted api 'model-reposit'", "restricted api: unknown category")
    s = qa.start(d, f"--model-repository={models} --http-restricted-api=model-repository:admin-key=admin-value "
                    f"--http-restricted-api=inference,metadata:infer-key=infer-value", "restricted.server.log")
    qa.unittest(d, "http_restricted_api_test.py", ["RestrictedAPITest"], server=s)
    if s:
        s.stop()

    # Input size limits
    lim = _fresh(d / "http_input_size_limit_test_models")
    _copytree(ident / "onnx_zero_1_float32", lim / "onnx_zero_1_float32")
    _copytree(models / "simple_identity", lim / "simple_identity")
    s = qa.start(d, "--model-repository=http_input_size_limit_test_models", "default_limit.server.log")
    names = ["InferSizeLimitTest.test_default_limit_raw_binary", "InferSizeLimitTest.test_default_limit_json",
             "InferSizeLimitTest.test_large_string_in_json", "InferSizeLimitTest.test_default_limit_compressed",
             "InferSizeLimitTest.test_json_dtype_size_expansion_exceeds_limit_error"]
    for n in names:
        qa.unittest(d, "http_input_size_limit_test.py", [n], server=s)
    qa.unittest(d, "http_input_size_limit_test.py",
                ["InferSizeLimitTest.test_no_leak_on_invalid_inference_header_length"], server=s,
                env={"SERVER_PID": str(s.proc.pid)} if s else None)
    if s:
        s.stop()
    s = qa.start(d, f"--model-repository=http_input_size_limit_test_models --http-max-input-size={2**27}",
                 "increased_limit.server.log")
    for n in ("test_large_input_raw_binary", "test_large_input_json", "test_large_input_compressed"):
        qa.unittest(d, "http_input_size_limit_test.py", [f"InferSizeLimitTest.{n}"], server=s)
    if s:
        s.stop()
    for value, log in (("0", "zero_limit"), ("-1024", "negative_limit")):
        qa.refused(d, f"--model-repository=http_input_size_limit_test_models --http-max-input-size={value}",
                   f"{log}.server.log", "Error: --http-max-input-size must be greater than 0.",
                   f"--http-max-input-size={value} refused")

    # Requests with many chunks
    s = qa.start(d, f"--model-repository={models} --allow-client-shm=true --log-verbose=1 "
                    f"--model-control-mode=explicit --load-model=simple", "many_chunks.server.log")
    qa.unittest(d, "http_request_many_chunks.py", server=s, env={"SERVER_PID": str(s.proc.pid)} if s else None)
    if s:
        s.stop()


def _binary_json_checks(qa) -> None:
    seq = ",".join(str(i) for i in range(1, 17))
    inputs = (f'"inputs":[{{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[{seq}]}},'
              f'{{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[{seq}]}}]')
    add, sub = "[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]", "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]"
    cases = [
        ("no parameters, no outputs: JSON", "{" + inputs + "}", 1, 1),
        ("binary_data true/false per output", "{" + inputs + ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},'
         '{"name":"OUTPUT1","parameters":{"binary_data":false}}]}', 0, 1),
        ("binary_data true, other unset", "{" + inputs + ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},'
         '{"name":"OUTPUT1"}]}', 0, 1),
        ("binary_data_output, no outputs", '{"parameters":{"binary_data_output":true},' + inputs + "}", 0, 0),
        ("binary_data_output, output overrides", '{"parameters":{"binary_data_output":true},' + inputs +
         ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}},{"name":"OUTPUT1"}]}', 1, 1),
    ]
    for name, body, n_add, n_sub in cases:
        code, out = _curl(body)
        ok = code == 200 and out.count(add) == n_add and out.count(sub) == n_sub
        qa.check(f"binaryjson: {name}", ok, f"{code} {out[:300]}")
    short = ",".join(str(i) for i in range(1, 16))
    code, out = _curl('{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[' + short + "]}]}")
    qa.check("binaryjson: too few data elements",
             code != 200 and '{"error":"Failed to parse \'data\' field: shape does not match true shape"}' in out,
             f"{code} {out}")
    long = ",".join(str(i) for i in range(1, 19))
    code, out = _curl('{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[' + long + "]}]}")
    qa.check("binaryjson: too many data elements",
             code != 200 and '{"error":"Unable to parse \'data\': Shape does not match true shape of \'data\' field"}' in out,
             f"{code} {out}")
    code, out = _curl("{" + inputs + "}")
    qa.check("binaryjson: server still answers", code == 200 and add in out and sub in out, f"{code} {out[:200]}")


# ====================================================================== L0_input_validation
def l0_input_validation(qa) -> None:
    d = qa.qa / "L0_input_validation"
    s = qa.start(d, f"--model-repository={d / 'models'}", "server.log")
    qa.unittest(d, "input_validation_test.py", ["InputValTest"], server=s)
    if s:
        s.stop()
    pt = d / "models" / "pt_identity"
    (pt / "1").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", "import torch; torch.jit.save(torch.jit.script(torch.nn.Identity()), "
                    f"{str(pt / '1' / 'model.pt')!r})"], check=True)
    (pt / "config.pbtxt").write_text(
        'name: "pt_identity"\nbackend: "pytorch"\nmax_batch_size: 8\n'
        'input [\n  {\n    name: "INPUT0"\n    data_type: TYPE_FP32\n    dims: [8]\n  }\n]\n'
        'output [\n  {\n    name: "OUTPUT0"\n    data_type: TYPE_FP32\n    dims: [8]\n  }\n]\n'
        "dynamic_batching {\n    max_queue_delay_microseconds: 1000000\n}\n")
    _copytree(qa.data / "qa_model_repository" / "onnx_object_int32_int32", d / "models" / "onnx_object_int32_int32")
    _note(qa, "plan_*_zero_1_float32_int32 shape-tensor models (TensorRT)")
    s = qa.start(d, f"--model-repository={d / 'models'} --allow-client-shm=true", "shape.server.log")
    qa.unittest(d, "input_validation_test.py", ["InputShapeTest"], server=s)
    if s:
        s.stop()
    _note(qa, "input_byte_size_test and tensor_size_test (C++ programs built with Triton)")
    _fresh(d / "test_models")
    s = qa.start(d, f"--model-repository={d / 'test_models'} --model-control-mode=explicit --log-verbose=1",
                 "name.server.log")
    qa.unittest(d, "input_validation_test.py", ["ModelNameValidationTest"], server=s)
    if s:
        s.stop()


# ====================================================================== L0_shared_memory
SHM_TESTS = ("test_invalid_create_shm", "test_valid_create_set_register", "test_unregister_before_register",
             "test_unregister_after_register", "test_reregister_after_register", "test_unregister_after_inference",
             "test_register_after_inference", "test_too_big_shm", "test_mixed_raw_shm", "test_unregisterall",
             "test_infer_offset_out_of_bound", "test_infer_byte_size_out_of_bound", "test_infer_integer_overflow",
             "test_register_out_of_bound", "test_register_reserved_names", "test_register_invalid_shm_key",
             "test_python_client_leak")


def l0_shared_memory(qa) -> None:
    d = qa.qa / "L0_shared_memory"
    models = _fresh(d / "models")
    _copytree(qa.examples / "simple", models / "simple")

    def one(args: str, test: str, client: str, log: str, env: dict[str, str] | None = None) -> None:
        s = qa.start(d, args, log)
        qa.unittest(d, "shared_memory_test.py", [test], variant=client, env={"CLIENT_TYPE": client, **(env or {})},
                    server=s)
        if s:
            code = s.stop()
            qa.check(f"{test}[{client}]: graceful shutdown", code == 0, f"exit {code}")

    for client in ("http", "grpc"):
        one(f"--model-repository={models} --log-verbose=1 --backend-directory={BACKEND_DIR}",
            "SharedMemoryTest.test_client_shm_disabled_by_default", client, f"disabled.{client}.server.log")
    extra = f"--backend-directory={BACKEND_DIR} --allow-client-shm=true"
    for test in SHM_TESTS:
        for client in ("http", "grpc"):
            one(f"--model-repository={models} --log-verbose=1 {extra}", f"SharedMemoryTest.{test}", client,
                f"{test}.{client}.server.log")
    py = _fresh(d / "python_models")
    (py / "simple" / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "execute_delayed_model" / "model.py", py / "simple" / "1")
    shutil.copy(qa.qa / "python_models" / "execute_delayed_model" / "config.pbtxt", py / "simple")
    for test in ("test_unregister_shm_during_inference_single_req", "test_unregister_shm_during_inference_multiple_req",
                 "test_unregister_shm_after_inference"):
        for client in ("http", "grpc"):
            one(f"--model-repository={py} --log-verbose=1 {extra}", f"TestSharedMemoryUnregister.{test}_{client}",
                client, f"{test}.{client}.server.log")
    models = _fresh(d / "models")
    for backend in ("python", "onnx", "libtorch"):
        name = f"{backend}_int32_int32_int32"
        if backend == "python":
            (models / name / "1").mkdir(parents=True)
            shutil.copy(qa.qa / "python_models" / "add_sub" / "model.py", models / name / "1")
            shutil.copy(qa.qa / "python_models" / "add_sub" / "config.pbtxt", models / name)
            _sed(models / name / "config.pbtxt", "TYPE_FP32", "TYPE_INT32")
            _append(models / name / "config.pbtxt", "max_batch_size: 8")
        else:
            src = qa.data / "qa_model_repository" / name
            (models / name).mkdir(parents=True)
            shutil.copytree(src / "1", models / name / "1")
            shutil.copy(src / "config.pbtxt", models / name)
            shutil.copy(src / "output0_labels.txt", models / name)
    _note(qa, "plan and openvino add_sub models of test_large_shm_register_offset")
    for client in ("http", "grpc"):
        one(f"--model-repository={models} --log-verbose=1 {extra}", "SharedMemoryTest.test_large_shm_register_offset",
            client, f"large_offset.{client}.server.log", env={"BACKENDS": "python onnx libtorch"})


# ====================================================================== L0_grpc
def l0_grpc(qa) -> None:
    """L0_grpc's python cases: GrpcTest on its own repository, the aio client, the restricted
    protocol start-ups and RestrictedProtocolTest, the client plugin test."""
    d = qa.qa / "L0_grpc"
    _note(qa, "the example clients and C++ unit tests (client repository), grpc-health-probe (go install), "
              "grpc_basic_auth_test.py (nginx), densenet_onnx (downloaded by Dockerfile.QA), "
              "simple_string_dyna_sequence (Triton's C++ dyna_sequence test backend)")
    models = _fresh(d / "models")
    for m in ("simple", "simple_dyna_sequence", "simple_int8", "simple_identity", "simple_sequence", "simple_string"):
        _copytree(qa.examples / m, models / m)
    grpc_models = _fresh(d / "grpc_test_models")
    _copytree(models / "simple", grpc_models / "simple")
    ident = grpc_models / "string_identity"
    _copytree(qa.qa / "python_models" / "string_identity", ident)
    (ident / "1").mkdir(exist_ok=True)
    shutil.move(str(ident / "model.py"), str(ident / "1" / "model.py"))
    _sed(ident / "config.pbtxt", r"dims: \[ 1 \]", "dims: [ -1 ]")

    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository={grpc_models}", "grpc_test.server.log")
    qa.unittest(d, "python_unit_test.py", ["GrpcTest"], server=s)
    if s:
        s.stop()

    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository={d / 'client_plugin_models'} "
                    "--http-header-forward-pattern=.* --grpc-header-forward-pattern=.*", "client_plugin.server.log")
    qa.unittest(d, "grpc_client_plugin_test.py", server=s)
    if s:
        s.stop()

    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository={models} --allow-client-shm=true",
                 "aio.server.log")
    qa.unittest(d, "python_grpc_aio_test.py", server=s)
    if s:
        s.stop()

    qa.refused(d, f"--model-repository={models} --grpc-restricted-protocol=model-repository,health:k1=v1 "
                  "--grpc-restricted-protocol=metadata,health:k2=v2", "restricted_repeated.server.log",
               "protocol 'health' can not be specified in multiple config groups", "repeated restricted protocol")
    qa.refused(d, f"--model-repository={models} --grpc-restricted-protocol=model-reposit,health:k1=v1 "
                  "--grpc-restricted-protocol=metadata,health:k2=v2", "restricted_unknown.server.log",
               "unknown restricted protocol 'model-reposit'", "unknown restricted protocol")
    s = qa.start(d, f"--model-repository={models} --grpc-restricted-protocol=model-repository:admin-key=admin-value "
                    "--grpc-restricted-protocol=inference,health:infer-key=infer-value", "restricted.server.log")
    qa.unittest(d, "python_unit_test.py", ["RestrictedProtocolTest"], server=s)
    if s:
        s.stop()
