"""The small tensor and protocol suites (string, scalar, NaN/Inf, zero-size, reshaped, variable
and optional tensors, output names, non-batching clients, parameters, server status): each
mirrors its qa/L0_*/test.sh for the CPU backends tritond runs (onnx, libtorch, python,
identity). Plan (TensorRT) models are never generated here, so their cases are listed as not run.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from suites_http import _append, _copytree, _curl, _fresh, _note, _sed
from suites_lifecycle import _version
from suites_models import _gpu_count

NUMPY1 = Path(__file__).resolve().parent / "numpy1"


def _drop_cpu_bf16(qa, models: Path) -> None:
    """ONNX Runtime's CPU provider has no BF16 kernels (test.sh runs them on a GPU, and drops
    them itself for its CPU targets): on a host without GPUs the onnx BF16 models are left out."""
    if _gpu_count() == 0:
        for bf16 in sorted(models.glob("onnx_*bf16*")):
            shutil.rmtree(bf16)
            print(f"  (deviation: {bf16.name} left out: no BF16 kernels on ONNX Runtime's CPU provider)", flush=True)


def _drop_orphan_ensembles(models: Path) -> None:
    """Leave out the ensembles over models not generated here (TensorRT plans, CPU-less BF16),
    as tritonserver would refuse them too; each is printed."""
    while True:
        names = {m.name for m in models.iterdir() if m.is_dir()}
        orphans = []
        for name in sorted(names):
            text = (models / name / "config.pbtxt").read_text() if (models / name / "config.pbtxt").exists() else ""
            if "ensemble_scheduling" in text and set(re.findall(r'model_name:\s*"([^"]+)"', text)) - names:
                orphans.append(name)
        if not orphans:
            return
        for name in orphans:
            shutil.rmtree(models / name)
            print(f"  (not run: ensemble {name}: composes a model not generated here)", flush=True)


def _nop_versions(models: Path) -> None:
    """util.sh's create_nop_version_dir."""
    for nop in models.glob("nop_*"):
        (nop / "1").mkdir(parents=True, exist_ok=True)


def _copy_glob(src: Path, pattern: str, dest: Path) -> None:
    for entry in sorted(src.glob(pattern)):
        if entry.is_dir():
            _copytree(entry, dest / entry.name)


def _python_model(qa, models: Path, name: str, source: str, subs: tuple[tuple[str, str], ...] = ()) -> Path:
    """A python model from qa/python_models/<source>, its config edited as test.sh's seds."""
    dest = models / name
    (dest / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(qa.qa / "python_models" / source / "model.py", dest / "1" / "model.py")
    shutil.copy(qa.qa / "python_models" / source / "config.pbtxt", dest / "config.pbtxt")
    for old, new in subs:
        _sed(dest / "config.pbtxt", old, new)
    return dest


def _script(qa, cwd: Path, case: str, argv: list[str], server) -> None:
    """A test.sh step that runs a python program and checks only its exit status."""
    if server is None:
        qa.record("test.sh", case, "error", f"server did not start: {qa.last_start_error}")
        return
    r = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    with open(qa.results / f"{qa.suite}.client.log", "a") as out:
        out.write(f"\n=== {' '.join(argv)}\n{r.stdout}{r.stderr}")
    qa.check(case, r.returncode == 0, (r.stdout + r.stderr)[-1500:])


def _one_server(qa, d: Path, args: str, module: str, names: list[str] | tuple[str, ...] = (),
                log: str = "server.log", env: dict[str, str] | None = None, variant: str = "") -> None:
    s = qa.start(d, args, log, env=env)
    qa.unittest(d, module, names, server=s, env=env, variant=variant)
    if s:
        s.stop()


# ====================================================================== L0_string_io
def l0_string_io(qa) -> None:
    d = qa.qa / "L0_string_io"
    models = _fresh(d / "models")
    _copytree(qa.data / "qa_identity_model_repository" / "onnx_zero_1_object", models / "onnx_zero_1_object")
    _python_model(qa, models, "string_identity", "string_identity", ((r"\[ 1 \]", "[ 8 ]"),))
    _one_server(qa, d, f"--model-repository={models}", "string_client_test.py")


# ====================================================================== L0_nullchar_string
def l0_nullchar_string(qa) -> None:
    d = qa.qa / "L0_nullchar_string"
    models = _fresh(d / "models")
    _python_model(qa, models, "python_string", "string", (('name: "string"', 'name: "python_string"'),))
    _copytree(qa.data / "qa_identity_model_repository" / "libtorch_nobatch_zero_1_object",
              models / "libtorch_nobatch_zero_1_object")
    s = qa.start(d, "--model-repository=models", "server.log")
    for model in ("python_string", "libtorch_nobatch_zero_1_object"):
        for protocol, extra in (("http", []), ("grpc", ["-i", "grpc", "-u", "localhost:8001"])):
            _script(qa, d, f"nullchar_string_client.py -m {model} ({protocol})",
                    ["nullchar_string_client.py", "-m", model, *extra, "-v"], s)
    if s:
        s.stop()


# ====================================================================== L0_scalar_io
def l0_scalar_io(qa) -> None:
    d = qa.qa / "L0_scalar_io"
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_scalar_models", "onnx_*", models)
    _one_server(qa, d, f"--model-repository={models}", "scalar_test.py", env={"BACKENDS": "onnx"})
    _sed(models / "onnx_scalar_1dim" / "config.pbtxt", r"dims.*", "dims:[2]")
    qa.refused(d, f"--model-repository={models}", "refused.server.log", "onnx_scalar_1dim",
               "scalar model with dims [2] refused")


# ====================================================================== L0_nan_inf
def l0_nan_inf(qa) -> None:
    d = qa.qa / "L0_nan_inf"
    (d / "models" / "nan_inf_output" / "1").mkdir(parents=True, exist_ok=True)
    print("  (deviation: the test and its model use np.NINF, gone in numpy 2; numpy1/ restores it)", flush=True)
    path = os.pathsep.join(p for p in (str(NUMPY1), os.environ.get("PYTHONPATH", "")) if p)
    _one_server(qa, d, f"--model-repository={d / 'models'}", "nan_inf_test.py", env={"PYTHONPATH": path})


# ====================================================================== L0_infer_zero
def l0_infer_zero(qa) -> None:
    d = qa.qa / "L0_infer_zero"
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_identity_model_repository", "*", models)
    _copy_glob(qa.data / "qa_ensemble_model_repository" / "qa_identity_model_repository", "*", models)
    for compat in models.glob("plan_compatible*"):
        shutil.rmtree(compat)
    _drop_orphan_ensembles(models)
    _nop_versions(models)
    _one_server(qa, d, f"--model-repository={models}", "infer_zero_test.py")


# ====================================================================== L0_infer_reshape
RESHAPE_CUSTOM = ("nobatch_zero_3_float32", "nobatch_zero_4_float32", "zero_1_float32", "zero_2_float32",
                  "zero_3_float32", "zero_4_float32", "nobatch_zero_1_int32", "nobatch_zero_2_int32",
                  "nobatch_zero_3_int32", "zero_1_int32", "zero_2_int32", "zero_3_int32")


def l0_infer_reshape(qa) -> None:
    d = qa.qa / "L0_infer_reshape"
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_reshape_model_repository", "*", models)
    _copy_glob(qa.data / "qa_ensemble_model_repository" / "qa_reshape_model_repository", "*", models)
    for name in RESHAPE_CUSTOM:
        dest = models / f"custom_{name}"
        _copytree(models / f"onnx_{name}", dest)
        for entry in (dest / "1").iterdir():
            entry.unlink() if entry.is_file() else shutil.rmtree(entry)
        cfg = dest / "config.pbtxt"
        _sed(cfg, r"(?m)^platform:.*", 'backend: "identity"')
        _sed(cfg, r"(?m)^name:.*", f'name: "custom_{name}"')
        _append(cfg, "instance_group [ { kind: KIND_CPU }]")
    _drop_orphan_ensembles(models)
    _nop_versions(models)
    _one_server(qa, d, f"--model-repository={models}", "infer_reshape_test.py")


# ====================================================================== L0_infer_variable
def l0_infer_variable(qa) -> None:
    d = qa.qa / "L0_infer_variable"
    _note(qa, "the gpu target (no GPU here)")
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_variable_model_repository", "*", models)
    _copy_glob(qa.data / "qa_ensemble_model_repository" / "qa_variable_model_repository", "*", models)
    for bf16 in models.glob("onnx_*bf16*"):
        shutil.rmtree(bf16)
    _drop_orphan_ensembles(models)
    _nop_versions(models)
    for fw in ("onnx", "libtorch"):
        for mc in sorted(glob.glob(str(models / f"{fw}*" / "config.pbtxt"))):
            _append(Path(mc), "instance_group [ { kind: KIND_CPU }]")
    _one_server(qa, d, f"--model-repository={models} --exit-timeout-secs=120", "infer_variable_test.py",
                log="cpu.server.log", variant="cpu")


# ====================================================================== L0_optional_input
OPTIONAL_INPUT_TESTS = ("test_all_inputs", "test_optional_same_input", "test_optional_mix_inputs",
                        "test_optional_mix_inputs_2", "test_ensemble_all_inputs",
                        "test_ensemble_optional_same_input", "test_ensemble_optional_mix_inputs",
                        "test_ensemble_optional_mix_inputs_2", "test_ensemble_optional_pipeline",
                        "test_ensemble_optional_connecting_tensor")


def l0_optional_input(qa) -> None:
    d = qa.qa / "L0_optional_input"
    for m in ("identity_2_float32", "ensemble_identity_2_float32", "pipeline_identity_2_float32",
              "optional_connecting_tensor"):
        (d / "models" / m / "1").mkdir(parents=True, exist_ok=True)
    for test in OPTIONAL_INPUT_TESTS:
        _one_server(qa, d, f"--model-repository={d / 'models'} --log-verbose=1", "optional_input_test.py",
                    [f"OptionalInputTest.{test}"], log=f"{test}.server.log")


# ====================================================================== L0_output_name
def l0_output_name(qa) -> None:
    d = qa.qa / "L0_output_name"
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_identity_model_repository", "*_nobatch_zero_1_float32", models)
    _note(qa, "plan_nobatch_zero_1_float32 (TensorRT): the test's plan trial fails on the missing model")
    _one_server(qa, d, f"--model-repository={models}", "output_name_test.py", ["OutputNameValidationTest"])


# ====================================================================== L0_client_nobatch
def l0_client_nobatch(qa) -> None:
    d = qa.qa / "L0_client_nobatch"
    models = _fresh(d / "qa_model_repository")
    _copy_glob(qa.data / "qa_model_repository", "onnx_*", models)
    _drop_cpu_bf16(qa, models)
    _one_server(qa, d, f"--model-repository={models}", "client_test.py")


# ====================================================================== L0_parameters
PARAMETER_TESTS = {
    "test_params": "",
    "test_params_reserved_rejected": "",
    "test_headers": " --grpc-header-forward-pattern MY_HEADER.* --http-header-forward-pattern MY_HEADER.*",
    "test_grpc_header_forward_pattern_case_sensitive": " --grpc-header-forward-pattern (?-i)MY_HEADER.*",
    "test_headers_reserved_rejected": " --grpc-header-forward-pattern .* --http-header-forward-pattern .*",
}


def l0_parameters(qa) -> None:
    d = qa.qa / "L0_parameters"
    for m in ("identity", "ensemble"):
        (d / "model_repository" / m / "1").mkdir(parents=True, exist_ok=True)
    for test, extra in PARAMETER_TESTS.items():
        s = qa.start(d, f"--model-repository=model_repository --exit-timeout-secs=120{extra}", f"{test}.server.log")
        qa.unittest(d, "parameters_test.py", [f"InferenceParametersTest.{test}"], server=s)
        if s:
            s.stop()
    models = _fresh(d / "models")
    _python_model(qa, models, "identity_fp32", "identity_fp32")
    _python_model(qa, models, "identity_bytes", "identity_fp32",
                  (("identity_fp32", "identity_bytes"), ("TYPE_FP32", "TYPE_STRING")))
    for client_type in ("http", "grpc"):
        _one_server(qa, d, f"--model-repository={models} --log-verbose=1", "class_count_test.py",
                    log=f"class_count_test_{client_type}.server.log", env={"CLIENT_TYPE": client_type},
                    variant=client_type)


# ====================================================================== L0_server_status
def l0_server_status(qa) -> None:
    d = qa.qa / "L0_server_status"
    models = _fresh(d / "models")
    _copy_glob(qa.data / "qa_model_repository", "*", models)
    _drop_cpu_bf16(qa, models)
    env = {"TRITON_SERVER_VERSION": _version()}     # set in Triton's container to its server's version
    print("  (deviation: --allow-client-shm=true, tritond's default refuses client shared memory and so leaves "
          "system_shared_memory out of the extensions)", flush=True)
    s = qa.start(d, f"--repository-poll-secs=1 --model-control-mode=poll --model-repository={models} "
                    f"--allow-client-shm=true", "server.log")
    qa.unittest(d, "server_status_test.py", ["ServerMetadataTest"], server=s, env=env)
    if s:
        for backend in ("libtorch", "onnx"):
            for version in ("2", "3"):
                shutil.rmtree(models / f"{backend}_int32_int32_int32" / version, ignore_errors=True)
        _note(qa, "plan_float16_float32_float32 version 7 (TensorRT): test_model_versions_added checks only it")
        time.sleep(3)
        status, body = _curl("", "http://localhost:8000/v2/repository/index")
        qa.check("POST /v2/repository/index", status == 200, body[-300:])
    qa.unittest(d, "server_status_test.py", ["ModelMetadataTest"], server=s, env=env)
    if s:
        s.stop()
