"""Model configuration suites: L0_model_config (auto-complete, and every invalid config it
checks, each refused at start-up with Triton's message). See qa_suites.py.

A refused start-up is checked as test.sh checks it: the server must not start, and one of the
case's `expected*` files, a grep pattern, must match an error line (`^E<MMDD>`) of its log.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from suites_decoupled import _standin
from suites_http import _copytree, _fresh, _note, _sed
from suites_models import _cpu_kind, _gpu_count

NO_MODEL = {"tensorrt": "TensorRT plans (qa_*_model_repository/plan_*) are not generated here",
            "openvino": "OpenVINO models (qa/openvino_models) are not generated here"}


def _grep_pattern(bre: str) -> str:
    """A grep basic regular expression as a Python one: in BRE, ( ) { } + ? | are literals."""
    out, i = [], 0
    while i < len(bre):
        c = bre[i]
        if c == "\\" and i + 1 < len(bre):
            nxt = bre[i + 1]
            out.append(nxt if nxt in "(){}+?|" else "\\" + nxt)
            i += 2
            continue
        out.append("\\" + c if c in "(){}+?|" else c)
        i += 1
    return "".join(out)


def _log_has(text: str, letter: str, pattern: str) -> bool:
    rx = re.compile(f"^{letter}[0-9]{{4}}.*{_grep_pattern(pattern)}")
    return any(rx.search(line) for line in text.splitlines())


# Cases whose expected message needs a GPU: (what Triton says instead on a host without one, why).
NEEDS_GPU = {
    "negative_gpu": ("instance group negative_gpu_0 of model negative_gpu has kind KIND_CPU but specifies one or "
                     "more GPUs", "its first instance group puts gpus [0] on KIND_AUTO, which without a GPU becomes "
                     "KIND_CPU and is refused as such (as by Triton) before the group the case is about"),
}


def _expect_refused(qa, cwd: Path, args: str, log: str, case: str, expecteds: list[Path],
                    letter: str = "E") -> None:
    """test.sh's run_server that must fail, then its grep for one expected message."""
    server = qa.start(cwd, args, log, timeout=60)
    if server is not None:
        server.stop()
        qa.check(case, False, "unexpected success starting the server")
        return
    text = server_text(qa, log)
    patterns = [p.read_text().strip() for p in expecteds]
    instead, why = NEEDS_GPU.get(Path(case).name, ("", ""))
    if instead and _gpu_count() == 0 and _log_has(text, letter, instead):
        qa.record("test.sh", case, "skip", why)
        return
    qa.check(case, any(_log_has(text, letter, p) for p in patterns),
             f"no {letter} line matches {patterns}; log ends: {text[-700:]}")


def server_text(qa, log: str) -> str:
    path = qa.results / f"{qa.suite}.{log}"
    return path.read_text(errors="replace") if path.exists() else ""


# ====================================================================== L0_model_config
def _mc_prepare(qa, d: Path) -> None:
    """test.sh's copies into the test repositories, for the models generated here."""
    qa_models = qa.data / "qa_model_repository"
    ens_dirs = """invalid_input_map/invalid_input_map invalid_input_map/fp32_dim1_batch4
        invalid_input_map/fp32_dim1_batch4_input4 invalid_input_map/fp32_dim1_batch4_output3
        invalid_output_map/invalid_output_map invalid_output_map/fp32_dim1_batch4
        invalid_output_map/fp32_dim1_batch4_input4 invalid_output_map/fp32_dim1_batch4_output3
        invalid_batch_size/invalid_batch_size invalid_batch_size/fp32_dim1_batch2 invalid_batch_size/fp32_dim1_batch4
        invalid_decoupled_branching/invalid_decoupled_branching invalid_decoupled_branching/int32_dim1_nobatch_output2
        invalid_decoupled_branching_2/invalid_decoupled_branching_2 inconsistent_shape/inconsistent_shape
        inconsistent_shape/fp32_dim1_batch4 inconsistent_shape/fp32_dim3_batch4
        inconsistent_data_type/inconsistent_data_type inconsistent_data_type/fp32_dim1_batch2
        inconsistent_data_type/int32_dim1_batch4 non_existing_model/non_existing_model
        non_existing_model/fp32_dim1_batch4 non_existing_model/fp32_dim1_batch4_output3
        self_circular_dependency/self_circular_dependency self_circular_dependency/fp32_dim1_batch4
        self_circular_dependency/fp32_dim1_batch4_input4 self_circular_dependency/fp32_dim1_batch4_output3
        unmapped_input/unmapped_input unmapped_input/fp32_dim1_batch4 unmapped_input/fp32_dim1_batch4_input4
        unmapped_input/fp32_dim1_batch4_output3 circular_dependency/circular_dependency
        circular_dependency/circular_dependency_2 no_required_version/no_required_version no_required_version/simple
        no_required_version_2/no_required_version_2 no_required_version_2/simple
        no_required_version_3/no_required_version_3 no_required_version_3/simple""".split()
    for p in ens_dirs:
        (d / "autofill_noplatform" / "ensemble" / p / "1").mkdir(parents=True, exist_ok=True)
    for p in """embedded_ensemble/embedded_ensemble embedded_ensemble/fp32_dim1_batch4 embedded_ensemble/inner_ensemble
        inconsistent_shape/inconsistent_shape inconsistent_shape/fp32_dim1_batch4 inconsistent_shape/fp32_dim2_nobatch
        inconsistent_shape_2/inconsistent_shape_2 inconsistent_shape_2/fp32_dim1_batch4
        inconsistent_shape_2/fp32_dim2_nobatch unmapped_output/unmapped_output
        unmapped_output/fp32_dim1_batch4_output3""".split():
        (d / "autofill_noplatform_success" / "ensemble" / p / "1").mkdir(parents=True, exist_ok=True)
    # the C++ repeat backend: its python_backend example stands in (the qa config, backend python)
    for case in ("invalid_decoupled_branching", "invalid_decoupled_branching_2"):
        models = d / "autofill_noplatform" / "ensemble" / case
        cfg = (models / "repeat_int32" / "config.pbtxt").read_text()
        if _standin(qa, models, "repeat_int32"):
            (models / "repeat_int32" / "config.pbtxt").write_text(cfg.replace('backend: "repeat"', 'backend: "python"'))
    for p in ("autofill_noplatform/pytorch/too_few_inputs", "autofill_noplatform/pytorch/too_few_outputs",
              "autofill_noplatform_success/pytorch/no_name_platform", "autofill_noplatform_success/pytorch/cpu_instance"):
        (d / p / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(qa_models / "libtorch_float32_float32_float32" / "1" / "model.pt", d / p / "1")
    auto_complete = qa.qa / "python_models" / "auto_complete" / "model.py"
    for p in ("input_mismatch_datatype", "input_mismatch_dims", "output_mismatch_datatype", "output_mismatch_dims"):
        (d / "autofill_noplatform" / "python" / p / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(auto_complete, d / "autofill_noplatform" / "python" / p / "1")
    for p in ("incomplete_output", "unknown_input", "unknown_output", "empty_config"):
        (d / "autofill_noplatform_success" / "python" / p / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(auto_complete, d / "autofill_noplatform_success" / "python" / p / "1")
    own_model = [d / "autofill_noplatform" / "python" / p for p in (
        "conflicting_max_batch_size", "input_missing_datatype", "input_missing_dims", "input_missing_name",
        "output_missing_datatype", "output_missing_dims", "output_missing_name", "no_return",
        "conflicting_scheduler_sequence", "input_wrong_property", "model_transaction_policy_invalid_args",
        "model_transaction_policy_mismatch", "output_wrong_property")]
    own_model += [d / "autofill_noplatform_success" / "python" / p for p in (
        "dynamic_batching_no_op", "dynamic_batching", "incomplete_input", "model_transaction_policy",
        "model_transaction_policy_decoupled_false", "model_transaction_policy_no_op", "optional_input")]
    own_model += [d / "autofill_noplatform_success" / "python" / "conflicting_scheduler_ensemble" / p for p in (
        "conflicting_scheduler_ensemble", "ensemble_first_step", "ensemble_second_step")]
    for p in own_model:
        (p / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(p / "model.py", p / "1")
    for p in ("autofill_noplatform/custom/no_delimiter", "autofill_noplatform/custom/unknown_backend.unknown",
              "autofill_noplatform_success/custom/empty_config.identity",
              "autofill_noplatform_success/custom/no_backend.identity",
              "noautofill_platform/invalid_cpu", "noautofill_platform/invalid_gpu", "noautofill_platform/negative_gpu"):
        (d / p / "1").mkdir(parents=True, exist_ok=True)
    (d / "special_cases" / "invalid_platform" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(qa_models / "onnx_float32_float32_float32" / "1" / "model.onnx",
                d / "special_cases" / "invalid_platform" / "1")
    (d / "special_cases" / "runtime_escape" / "1").mkdir(parents=True, exist_ok=True)
    (d / "special_cases" / "runtime_escape" / "dummy_runtime").mkdir(parents=True, exist_ok=True)
    (d / "special_cases" / "runtime_escape" / "dummy_runtime" / "libtriton_identity.so").touch()
    (d / "special_cases" / "invalid_runtime" / "1").mkdir(parents=True, exist_ok=True)
    (d / "autofill_noplatform_success" / "onnx" / "cpu_instance" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(qa.data / "qa_identity_model_repository" / "onnx_zero_1_float16" / "1" / "model.onnx",
                d / "autofill_noplatform_success" / "onnx" / "cpu_instance" / "1")
    src = qa.qa / "python_models" / "async_execute_decouple"
    for mp in _cases(d, "model_metrics/*/*"):
        (mp / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "model.py", mp / "1")
        (mp / "config.pbtxt").write_text((src / "config.pbtxt").read_text() + (mp / "partial.pbtxt").read_text())


def _single_case(case_dir: Path, models: Path, whole: bool = False) -> Path:
    """test.sh copies a case that has a config.pbtxt (or is `whole`) as one model, otherwise its
    content as the repository."""
    _fresh(models)
    if whole or (case_dir / "config.pbtxt").exists() or case_dir.name.startswith("no_config"):
        _copytree(case_dir, models / case_dir.name)
        return models / case_dir.name
    for entry in case_dir.iterdir():
        (_copytree if entry.is_dir() else shutil.copy)(entry, models / entry.name)
    return models


def _cases(d: Path, pattern: str) -> list[Path]:
    """The case directories under `d` matching `pattern`, less those QA_MODEL_CONFIG_CASES (globs over
    the same relative paths, comma-separated; default all) leaves out."""
    wanted = os.environ.get("QA_MODEL_CONFIG_CASES", "*").split(",")
    return [p for p in sorted(d.glob(pattern))
            if p.is_dir() and any(fnmatch.fnmatch(str(p.relative_to(d)), w) for w in wanted)]


def _expect_cpu(model_dir: Path) -> bool:
    """On a host without GPUs, the expected configs of a model whose config sets no instance group
    become what Triton completes there: its KIND_AUTO group is KIND_CPU without gpus, with the CPU
    count (2 for onnxruntime and tensorflow). The expected files were written on a host with GPU 0."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_dir / "config.pbtxt"
    if _gpu_count() or (cfg.exists() and "instance_group" in cfg.read_text()):
        return False
    changed = False
    for path in model_dir.glob("expected*"):
        expected = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        for group in expected.instance_group:
            if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
                group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
                group.count = 2 if expected.backend in ("onnxruntime", "tensorflow") else 1
                changed = True
        path.write_text(text_format.MessageToString(expected))
    return changed


def l0_model_config(qa) -> None:
    d = qa.qa / "L0_model_config"
    _mc_prepare(qa, d)
    models = d / "models"
    repo = f"--model-repository={models}"
    _note(qa, "TensorRT and OpenVINO cases (their models are not generated here), custom_parameters "
              "(TensorRT plans only)")

    for target in _cases(d, "cli_messages/*"):
        extra = {"cli_override": "--disable-auto-complete-config --strict-model-config=false",
                 "cli_deprecation": "--strict-model-config=true"}.get(target.name, "")
        _single_case(target, models, whole=True)
        log = f"cli_messages_{target.name}.server.log"
        server = qa.start(d, f"{repo} {extra}", log, timeout=60)
        if server is not None:
            server.stop()
            qa.check(f"cli_messages/{target.name}", False, "unexpected success starting the server")
        else:
            text = server_text(qa, log)
            pats = [p.read_text().strip() for p in sorted((models / target.name).glob("expected*"))]
            qa.check(f"cli_messages/{target.name}",
                     any(re.search(_grep_pattern(p), text) for p in pats), f"log lacks {pats}: {text[-600:]}")

    for target in _cases(d, "special_cases/*"):
        extra = "--disable-auto-complete-config" if target.name == "invalid_platform" else ""
        _single_case(target, models)
        _expect_refused(qa, d, f"{repo} {extra}", f"special_case_{target.name}.server.log",
                        f"special_cases/{target.name}", sorted((models / target.name).glob("expected*")))

    for flag, tag in (("--strict-model-config=true", ""), ("--disable-auto-complete-config", "disableflag_")):
        for trial in ("tensorrt_plan", "onnxruntime_onnx", "pytorch_libtorch"):
            for target in _cases(d, "noautofill_platform/*"):
                _single_case(target, models)
                cfg = models / target.name / "config.pbtxt"
                _sed(cfg, r"(?m)^.*platform:.*\n?", "")
                cfg.write_text(cfg.read_text() + f'platform: "{trial}"\n')
                _expect_refused(qa, d, f"{repo} {flag}", f"noautofill_platform_{tag}{trial}_{target.name}.server.log",
                                f"noautofill_platform[{tag}{trial}]/{target.name}",
                                sorted((models / target.name).glob("expected*")))

    for target in _cases(d, "autofill_noplatform/*/*"):
        case = f"{target.parent.name}/{target.name}"
        if target.parent.name in NO_MODEL:
            qa.record("test.sh", f"autofill_noplatform/{case}", "skip", NO_MODEL[target.parent.name])
            continue
        dest = _single_case(target, models)
        _expect_refused(qa, d, f"{repo} --strict-model-config=false",
                        f"autofill_noplatform.{case.replace('/', '.')}.server.log", f"autofill_noplatform/{case}",
                        sorted(dest.glob("expected*")))

    for target in _cases(d, "autofill_noplatform_success/*/*"):
        case = f"autofill_noplatform_success/{target.parent.name}/{target.name}"
        if target.parent.name in NO_MODEL:
            qa.record("test.sh", case, "skip", NO_MODEL[target.parent.name])
            continue
        _single_case(target, models)
        if _expect_cpu(models / target.name):
            print(f"  (deviation: {case}: expected instance group KIND_GPU [0] -> KIND_CPU, no GPU on this host)",
                  flush=True)
        s = qa.start(d, f"{repo} --strict-model-config=false", f"{case.replace('/', '.')}.server.log", timeout=120)
        if s is None:
            qa.check(case, False, f"server did not start: {qa.last_start_error}")
            continue
        r = subprocess.run([sys.executable, "compare_status.py", "--expected_dir", f"models/{target.name}",
                            "--model", target.name], cwd=d, capture_output=True, text=True, timeout=120)
        s.stop()
        qa.check(case, r.returncode == 0, (r.stdout + r.stderr)[-1500:])

    metrics = "--metrics-config histogram_latencies=true"
    for target in _cases(d, "model_metrics/*/*"):
        kind, case = target.parent.name, f"model_metrics/{target.parent.name}/{target.name}"
        _single_case(target, models)
        log = f"model_metrics.{kind}.{target.name}.server.log"
        if kind == "invalid_config":
            _expect_refused(qa, d, f"{repo} {metrics}", log, case, [models / target.name / "expected"])
            continue
        s = qa.start(d, f"{repo} {metrics}", log, timeout=120)
        if s is None:
            qa.check(case, False, f"server did not start: {qa.last_start_error}")
            continue
        s.stop()
        if kind == "valid_config_with_warn":
            pat = (models / target.name / "expected").read_text().strip()
            qa.check(case, _log_has(s.text(), "W", pat), f"no W line matches '{pat}'")
        else:
            qa.check(case, True)
    for target in _cases(d, "custom_parameters/*/*/*"):
        qa.record("test.sh", f"custom_parameters/{target.parent.name}/{target.name}", "skip",
                  "TensorRT plan models (the allocation strategy of the TensorRT backend)")


# ====================================================================== L0_config_json
def _config_json(model: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://localhost:8000/v2/models/{model}/config", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _onnx_nobatch(qa, models: Path, append: str = "", sub: tuple[str, str] | None = None) -> None:
    name = "onnx_nobatch_float32_float32_float32"
    _copytree(qa.data / "qa_model_repository" / name, models / name)
    cfg = models / name / "config.pbtxt"
    if sub:
        _sed(cfg, *sub)
    if append:
        cfg.write_text(cfg.read_text() + append + "\n")


_WARMUP = "".join(f'''model_warmup [{{ name: "warmup {i}" batch_size: 1 inputs [{{ key: "INPUT0" value: {{
  data_type: TYPE_FP32 dims: 16 zero_data: true }} }}, {{ key: "INPUT1" value: {{ data_type: TYPE_FP32 dims: 16
  random_data: true }} }}] }}]
''' for i in (1, 2))

MAX_UINT64, MAX_UINT32 = 18446744073709551615, 4294967295


def l0_config_json(qa) -> None:
    """test.sh's trials: each starts a server, GETs the config and counts fragments of its JSON."""
    d = qa.qa / "L0_config_json"
    models = d / "models"
    nobatch = "onnx_nobatch_float32_float32_float32"
    policy = (f'{{"timeout_action":"REJECT","default_timeout_microseconds":{MAX_UINT64},'
              f'"allow_timeout_override":true,"max_queue_size":10}}')
    trials = [
        ("ios", lambda: _onnx_nobatch(qa, models), nobatch, [('"dims":[16]', 4)]),
        ("reshape", lambda: _onnx_nobatch(qa, models, sub=(r"data_type:.*TYPE_FP32",
                                                           "data_type: TYPE_FP32\nreshape: { shape: [ 16 ]}")),
         nobatch, [('"reshape":{"shape":[16]}', 4)]),
        ("specific", lambda: _onnx_nobatch(qa, models, sub=(r"(?m)^version_policy:.*",
                                                            "version_policy: { specific: { versions: [1] }}")),
         nobatch, [('"version_policy":{"specific":{"versions":[1]}}', 1)]),
        ("dbatch", lambda: _onnx_nobatch(qa, models, append=(
            "dynamic_batching: { max_queue_delay_microseconds: 42 default_queue_policy: { "
            "default_timeout_microseconds: 123 } priority_queue_policy: { key: 1  value: { "
            "default_timeout_microseconds: 123 }} priority_queue_policy: { key: 2  value: { "
            "default_timeout_microseconds: 123 }}}")),
         nobatch, [('"dynamic_batching":{', 1), ('"max_queue_delay_microseconds":42', 1),
                   ('"default_timeout_microseconds":123', 3)]),
        ("sbatch", lambda: _onnx_nobatch(qa, models, append=(
            "sequence_batching: { max_sequence_idle_microseconds: 42 oldest: { max_queue_delay_microseconds: 987 }}")),
         nobatch, [('"sequence_batching":{', 1), ('"max_sequence_idle_microseconds":42', 1), ('"oldest":{', 1),
                   ('"max_queue_delay_microseconds":987', 1)]),
        ("ensemble", lambda: (_onnx_nobatch(qa, models), (models / "simple_ensemble" / "1").mkdir(parents=True),
                              shutil.copy(d / "ensemble_config.pbtxt", models / "simple_ensemble" / "config.pbtxt")),
         "simple_ensemble", [('"model_version":1', 1), ('"model_version":-1', 1)]),
        ("warmup", lambda: _onnx_nobatch(qa, models, append=_WARMUP), nobatch, [('"dims":[16]', 8)]),
        ("max_priority_level", lambda: ((models / "max_priority_level" / "1").mkdir(parents=True),
                                        shutil.copy(d / "max_priority_level.pbtxt",
                                                    models / "max_priority_level" / "config.pbtxt")),
         "max_priority_level", [(f'"priority_levels":{MAX_UINT64}', 1), (f'"default_priority_level":{MAX_UINT32}', 1),
                                (f'"{MAX_UINT32 + 1}":{policy}', 1), (f'"default_timeout_microseconds":{MAX_UINT64}', 1)]),
    ]
    for trial, build, model, counts in trials:
        _fresh(models)
        build()
        s = qa.start(d, f"--model-repository={models}", f"{trial}.server.log")
        if s is None:
            qa.check(trial, False, f"server did not start: {qa.last_start_error}")
            continue
        code, body = _config_json(model)
        s.stop()
        wrong = [f"{frag} x{body.count(frag)} (expected {n})" for frag, n in counts if body.count(frag) != n]
        qa.check(trial, code == 200 and not wrong, f"HTTP {code}; {wrong}; {body[:1500]}")


# ====================================================================== L0_custom_model_config
def l0_custom_model_config(qa) -> None:
    """--model-config-name picks configs/<name>.pbtxt where it exists; an empty name is refused."""
    d = qa.qa / "L0_custom_model_config"
    models = _fresh(d / "models")
    name = "onnx_nobatch_float32_float32_float32"
    _onnx_nobatch(qa, models)
    cfg = models / name / "config.pbtxt"
    (models / name / "configs").mkdir()
    versions = {"": "1,3", "h100": "1", "v100": "2", "config": "3"}

    def policy(path: Path, v: str) -> None:
        _sed(path, r"(?m)^version_policy:.*", f"version_policy: {{ specific: {{ versions: [{v}] }}}}")

    policy(cfg, versions[""])
    for custom in ("h100", "v100", "config"):
        shutil.copy(cfg, models / name / "configs" / f"{custom}.pbtxt")
        policy(models / name / "configs" / f"{custom}.pbtxt", versions[custom])
    for flag, expect in (("", "1,3"), ("h100", "1"), ("v100", "2"), ("config", "3"), ("h200", "1,3")):
        args = f"--model-repository={models}" + (f" --model-config-name={flag}" if flag else "")
        s = qa.start(d, args, f"{flag or 'default'}.server.log")
        case = f"--model-config-name={flag}" if flag else "no --model-config-name"
        if s is None:
            qa.check(case, False, f"server did not start: {qa.last_start_error}")
            continue
        code, body = _config_json(name)
        s.stop()
        frag = f'"version_policy":{{"specific":{{"versions":[{expect}]}}}}'
        qa.check(case, code == 200 and body.count(frag) == 1, f"HTTP {code}; {frag} not once in {body[:800]}")
    s = qa.start(d, f"--model-repository={models} --model-config-name=", "empty.server.log", timeout=60)
    if s is not None:
        s.stop()
    qa.check("--model-config-name= (empty) refused", s is None, "server started with an empty --model-config-name")


# ====================================================================== L0_model_namespacing
NAMESPACING_TESTS = ("test_duplication", "test_dynamic_resolution", "test_ensemble_duplication", "test_no_duplication")


def l0_model_namespacing(qa) -> None:
    """Each test in poll and explicit mode over two repositories with --model-namespacing=true;
    tritond refuses that flag (model namespacing is not implemented), so a refused start-up
    records the test as skipped with tritond's reason."""
    d = qa.qa / "L0_model_namespacing"
    for suite, mode in (("ModelNamespacePoll", "--model-control-mode=POLL --repository-poll-secs=2"),
                        ("ModelNamespaceExplicit", "--model-control-mode=EXPLICIT")):
        for test in NAMESPACING_TESTS:
            for model_dir in (d / test).glob("*/*"):
                (model_dir / "1").mkdir(exist_ok=True)
            test_dir = d / "test_dir"
            _copytree(d / test, test_dir)
            args = (f"--model-namespacing=true --model-repository={test_dir / 'addsub_repo'} "
                    f"--model-repository={test_dir / 'subadd_repo'} {mode}")
            s = qa.start(d, args, f"server.{suite}.{test}.log", timeout=60)
            if s is None and "model namespacing" in qa.last_start_error:
                qa.record("test.py", f"{suite}.{test}", "skip", f"tritond refuses the flag: {qa.last_start_error}")
                continue
            env = {"NAMESPACE_TESTING_DIRCTORY": str(test_dir), "TRITON_QA_ROOT_DIR": str(qa.qa),
                   "TRITON_QA_PYTHON_MODEL_DIR": str(d)}
            qa.unittest(d, "test.py", [f"{suite}.{test}"], env=env, server=s)
            if s:
                s.stop()


# ====================================================================== ONNX Runtime suites
def l0_initializer_as_input(qa) -> None:
    """An ONNX model whose initializer is also a graph input (its own repository in qa/)."""
    d = qa.qa / "L0_initializer_as_input"
    s = qa.start(d, f"--model-repository={d / 'models'}", "server.log")
    qa.unittest(d, "test.py", server=s)
    if s:
        s.stop()


def l0_backend_onnxruntime(qa) -> None:
    """The BF16 ONNX model over HTTP and gRPC."""
    d = qa.qa / "L0_backend_onnxruntime"
    models = _fresh(d / "models")
    _copytree(qa.data / "qa_model_repository" / "onnx_bf16_bf16_bf16", models / "onnx_bf16_bf16_bf16")
    s = qa.start(d, f"--model-repository={models}", "server.log")
    missing = [ln for ln in server_text(qa, "server.log").splitlines() if "NOT_IMPLEMENTED" in ln]
    if s is None and missing:
        for client in ("http", "grpc"):
            qa.record("test.py", f"BFloat16Test[{client}]", "skip", "ONNX Runtime's CPU execution provider has no "
                      "BF16 kernels (Triton runs this model on a GPU): "
                      + missing[0][missing[0].index("NOT_IMPLEMENTED"):][:200])
        return
    for client in ("http", "grpc"):
        qa.unittest(d, "test.py", variant=client, env={"CLIENT_TYPE": client}, server=s)
    if s:
        s.stop()


# test.sh's models: name suffix -> what it appends to onnx_float32_float32_float32's config
ORT_VARIANTS = {
    "session_config": 'parameters: { key: "session.use_device_allocator_for_initializers" value: { string_value: "1" }}',
    "cuda_config": 'parameters: { key: "cudnn_conv_algo_search" value: { string_value: "1" }}\n'
                   'parameters: { key: "arena_extend_strategy" value: { string_value: "1" }}\n'
                   'parameters: { key: "gpu_mem_limit" value: { string_value: "18446744073709551614" }}',
    "cuda_param_field": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "cuda" '
                        'parameters { key: "cudnn_conv_use_max_workspace" value: "0" } '
                        'parameters { key: "use_ep_level_unified_stream" value: "1" } }]}}',
    "cpu_config": 'parameters: { key: "intra_op_thread_count" value: { string_value: "1" }}\n'
                  'parameters: { key: "enable_mem_arena" value: { string_value: "1" }}\n'
                  'parameters: { key: "enable_mem_pattern" value: { string_value: "1" }}\n'
                  'parameters: { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" }}',
    "trt": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt"} ] } }',
    "trt_param": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" '
                 'parameters { key: "precision_mode" value: "FP16" } '
                 'parameters { key: "max_workspace_size_bytes" value: "1073741824" } }]}}',
    "trt_cache_on": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" '
                    'parameters { key: "trt_engine_cache_enable" value: "1" } }]}}',
    "trt_unknown_param": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" '
                         'parameters { key: "precision_mode" value: "FP16" } '
                         'parameters { key: "segment_size" value: "1" } }]}}',
    "trt_invalid_param": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" '
                         'parameters { key: "precision_mode" value: "FP16" } '
                         'parameters { key: "max_workspace_size_bytes" value: "abc" } }]}}',
    "unknown_gpu": 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "unknown_gpu" } ] } }',
}
# test.sh's greps of the server log: those that need the models' instances on a GPU (CUDA and
# TensorRT execution providers; on a CPU instance Triton's backend reads no GPU accelerator either)
ORT_GPU_CHECKS = (
    "TensorRT Execution Accelerator is set for '{m}_trt'", "TensorRT Execution Accelerator is set for '{m}_trt_param'",
    "TensorRT Execution Accelerator is set for '{m}_trt_cache_on'",
    "failed to load '{m}_trt_unknown_param' version 1: Invalid argument: unknown parameter 'segment_size' is "
    "provided for TensorRT Execution Accelerator",
    "failed to load '{m}_trt_invalid_param' version 1: Invalid argument: failed to convert 'abc' to unsigned long "
    "long integral number",
    "failed to load '{m}_unknown_gpu' version 1: Invalid argument: unknown Execution Accelerator 'unknown_gpu' is "
    "requested",
    "memory limit: 18446744073709551614 arena_extend_strategy: 1",
    "CUDA Execution Accelerator is set for '{m}_cpu_config'",
    "CUDA Execution Accelerator is set for '{m}_cuda_param_field' (use_ep_level_unified_stream=1, "
    "cudnn_conv_use_max_workspace=0)",
)
ORT_CPU_CHECKS = ("Configuring 'session.use_device_allocator_for_initializers' to '1'", "Configuring enable_mem_arena to 1",
                  "Configuring enable_mem_pattern to 1", "Configuring memory.enable_memory_arena_shrinkage to cpu:0")


def l0_onnx_optimization(qa) -> None:
    """test.sh's ten variants of one ONNX model (five instances each), then its greps of the log."""
    d = qa.qa / "L0_onnx_optimization"
    models = _fresh(d / "models")
    m = "onnx_float32_float32_float32"
    base = models / f"{m}_test"
    _copytree(qa.data / "qa_model_repository" / m, base)
    for v in ("2", "3"):
        shutil.rmtree(base / v, ignore_errors=True)
    _sed(base / "config.pbtxt", "_float32_float32_float32", "_float32_float32_float32_test")
    with open(base / "config.pbtxt", "a") as f:
        f.write("\ninstance_group { count: 5 }\n")
    for suffix, extra in ORT_VARIANTS.items():
        variant = models / f"{m}_{suffix}"
        _copytree(base, variant)
        _sed(variant / "config.pbtxt", "_float32_test", f"_float32_{suffix}")
        with open(variant / "config.pbtxt", "a") as f:
            f.write(extra + "\n")
    s = qa.start(d, f"--model-repository={models} --log-verbose=1 --exit-on-error=false", "inference_server.log",
                 timeout=600)
    qa.check("server starts", s is not None, qa.last_start_error)
    if s is None:
        return
    text = s.text()
    s.stop()
    for line in ORT_CPU_CHECKS:
        qa.check(f"grep {line}", line in text, "not in the server log")
    for line in ORT_GPU_CHECKS:
        qa.record("test.sh", f"grep {line.format(m=m)}", "skip",
                  "needs the model's instances on a GPU (CUDA and TensorRT execution providers)")


def l0_priority(qa) -> None:
    for level in ("MIN", "MAX", "DEFAULT"):
        qa.record("test.sh", f"{level} stream priority", "skip",
                  "TensorRT plan models (plan_float32_float32_float32, not generated here) and their CUDA stream "
                  "priority (a GPU)")


def l0_backend_output_detail(qa) -> None:
    qa.record("test.sh", "backend_output_detail_test", "skip",
              "a C++ program over Triton's in-process API (backend_output_detail_test), no client to run here")


# ====================================================================== PyTorch suites
def _libtorch_copy(qa, models: Path, src: str, name: str, subs: list[tuple[str, str]] = (),
                   repo: str = "qa_model_repository") -> Path:
    _copytree(qa.data / repo / src, models / name)
    cfg = models / name / "config.pbtxt"
    _sed(cfg, re.escape(src), name)
    for pattern, repl in subs:
        _sed(cfg, pattern, repl, count=1 if pattern.startswith("^") else 0, flags=re.M)
    return cfg


def l0_libtorch_io_names(qa) -> None:
    """Input and output naming conventions of TorchScript models (index, argument names, mixed)."""
    d = qa.qa / "L0_libtorch_io_names"
    models = _fresh(d / "models")
    src = "libtorch_float32_float32_float32"
    variants = {
        "libtorch_output_index": [],
        "libtorch_io_index": [("INPUT0", "INPUT__0"), ("INPUT1", "INPUT__1")],
        "libtorch_no_output_index": [("OUTPUT__0", "OUTPUT0"), ("OUTPUT__1", "OUTPUT1")],
        "libtorch_no_arguments_output_index": [("INPUT0", "INPUTA"), ("INPUT1", "INPUTB"), ("OUTPUT__0", "OUTPUTA"),
                                               ("OUTPUT__1", "OUTPUTB")],
        "libtorch_mix_index": [("INPUT0", "INPUTA"), ("INPUT1", "INPUT__1"), ("OUTPUT__0", "OUTPUTA")],
        "libtorch_mix_arguments": [("INPUT1", "INPUTB"), ("OUTPUT__0", "OUTPUTA")],
        "libtorch_mix_arguments_index": [("INPUT1", "INPUT__1"), ("OUTPUT__0", "OUTPUT0")],
        "libtorch_unordered_index": [("INPUT0", "INPUT_TMP1"), ("INPUT1", "INPUT0"), ("INPUT_TMP1", "INPUT1"),
                                     ("OUTPUT__0", "OUT__1"), ("OUTPUT__1", "OUT__0")],
    }
    for name, subs in variants.items():
        cfg = _libtorch_copy(qa, models, src, name)
        for old, new in subs:           # sed 's/old/new/': the first match on each line
            cfg.write_text("\n".join(line.replace(old, new, 1) for line in cfg.read_text().split("\n")))
    s = qa.start(d, "--model-repository=models", "server.log")
    qa.unittest(d, "io_names_client.py", server=s)
    if s:
        s.stop()


def l0_libtorch_io_types(qa) -> None:
    """Types the PyTorch backend refuses, each a start-up that fails with the backend's message."""
    d = qa.qa / "L0_libtorch_io_types"
    cases = [
        ("libtorch_invalid_input_type", "libtorch_int32_int8_int8", "qa_model_repository",
         [("TYPE_INT32", "TYPE_UINT32")],
         "unsupported datatype TYPE_UINT32 for input 'INPUT0' for model 'libtorch_invalid_input_type'"),
        ("libtorch_invalid_output_type", "libtorch_int32_int8_int8", "qa_model_repository",
         [("TYPE_INT8", "TYPE_UINT64")],
         "unsupported datatype TYPE_UINT64 for output 'OUTPUT__0' for model 'libtorch_invalid_output_type'"),
        ("libtorch_invalid_sequence_int32", "libtorch_sequence_int32", "qa_variable_sequence_model_repository",
         [("READY__2", "CORRID__2"), ("CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID"),
          (r"CORRID\n(.*)int32_false_true: \[ 0, 1 \]", "CORRID\ndata_type: TYPE_UINT32")],
         "input 'CORRID__2' type 'TYPE_UINT32' is not supported by PyTorch."),
    ]
    for name, src, repo, subs, expect in cases:
        models = _fresh(d / "models")
        cfg = _libtorch_copy(qa, models, src, name, repo=repo)
        for old, new in subs:
            if old.startswith("CORRID\\n"):      # test.sh's multi-line sed, over line pairs
                _sed(cfg, old, new, count=1)
            else:
                cfg.write_text("\n".join(line.replace(old, new, 1) for line in cfg.read_text().split("\n")))
        _cpu_kind(qa, cfg)
        qa.refused(d, "--model-repository=models", f"{name}.server.log", expect, name)


def l0_libtorch_inference_mode(qa) -> None:
    """INFERENCE_MODE true and false: inference works under each."""
    d = qa.qa / "L0_libtorch_inference_mode"
    for flag in ("true", "false"):
        models = _fresh(d / "models")
        cfg = _libtorch_copy(qa, models, "libtorch_int32_int32_int32", "libtorch_int32_int32_int32")
        cfg.write_text(cfg.read_text() + f'parameters: {{ key: "INFERENCE_MODE" value: {{ string_value: "{flag}" }} }}\n')
        s = qa.start(d, "--model-repository=models --log-verbose=1", f"{flag}.server.log")
        qa.unittest(d, "../common/libtorch_infer_client.py", variant=flag, server=s)
        if s:
            s.stop()
        line = "Inference Mode is " + ("enabled" if flag == "true" else "disabled")
        qa.record("test.sh", f"'{line}' logged 3 times", "skip", "counts a verbose line of Triton's PyTorch backend "
                  "(how often it logs the mode), which no client observes; the inferences under each mode ran")


# ====================================================================== L0_storage_S3_local
S3_PORT = 4572
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "minio", "AWS_SECRET_ACCESS_KEY": "miniostorage"}


def _s3_repo(qa, root: Path, backends: str, types: str = "float32_float32_float32 object_object_object") -> Path:
    """test.sh's setup_model_repo: the models of each backend and type, version policy removed."""
    _fresh(root)
    for backend in backends.split():
        for kind in types.split():
            name = f"{backend}_{kind}"
            if not (qa.data / "qa_model_repository" / name).exists():
                continue        # test.sh's cp fails quietly too (libtorch has no object model)
            _copytree(qa.data / "qa_model_repository" / name, root / name)
            _sed(root / name / "config.pbtxt", r"(?m)^version_policy.*\n?", "")
    return root


class _Bucket:
    """A bucket of the local S3 server, filled as `awslocal s3 sync` fills it."""

    def __init__(self, name: str) -> None:
        import boto3
        self.name = name
        self.s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{S3_PORT}", region_name="us-east-1",
                               aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        self.remove()
        self.s3.create_bucket(Bucket=name)

    def sync(self, root: Path) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self.s3.upload_file(str(path), self.name, str(path.relative_to(root)))

    def remove(self) -> None:
        try:
            for obj in self.s3.list_objects_v2(Bucket=self.name).get("Contents", []):
                self.s3.delete_object(Bucket=self.name, Key=obj["Key"])
            self.s3.delete_bucket(Bucket=self.name)
        except self.s3.exceptions.NoSuchBucket:
            pass


def _load_all(qa, root: Path) -> None:
    import urllib.error
    import urllib.request
    for model in sorted(p.name for p in root.iterdir()):
        req = urllib.request.Request(f"http://localhost:8000/v2/repository/models/{model}/load", data=b"",
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                code, body = r.status, ""
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read().decode(errors="replace")
        qa.check(f"load {model}", code == 200, f"HTTP {code}: {body}")


def l0_storage_s3_local(qa) -> None:
    """Repositories in a local S3-compatible store. test.sh downloads MinIO; here moto's S3 server
    (PyPI moto[server]) serves on the same address, and boto3 does what `awslocal s3` does."""
    d = qa.qa / "L0_storage_S3_local"
    moto = Path(sys.executable).with_name("moto_server")
    if not moto.exists():
        qa.record("test.sh", "S3 repositories", "skip", "needs moto[server] (a local S3 server) in the venv")
        return
    print("  (deviation: moto's S3 server stands in for MinIO; BACKENDS 'onnx libtorch': plan models are not "
          "generated here)", flush=True)
    env = {**S3_CREDENTIALS, "BACKENDS": "onnx libtorch"}
    os.environ.update(S3_CREDENTIALS)
    log = open(qa.results / f"{qa.suite}.moto.log", "w")
    store = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(S3_PORT)], stdout=log, stderr=subprocess.STDOUT)
    try:
        import time
        time.sleep(3)
        _s3_cases(qa, d, env)
    finally:
        store.terminate()
        store.wait(30)
        log.close()
    _s3_http2(qa, d)


def _s3_cases(qa, d: Path, env: dict[str, str]) -> None:
    import time
    models = _s3_repo(qa, d / "models", "onnx libtorch")
    _copytree(models / "libtorch_float32_float32_float32", models / "Model_repo-1.0")
    _sed(models / "Model_repo-1.0" / "config.pbtxt", "libtorch_float32_float32_float32", "Model_repo-1.0")
    bucket = _Bucket("demo-bucket1.0")
    bucket.sync(models)
    for host in ("127.0.0.1", "localhost"):
        s = qa.start(d, f"--model-repository=s3://{host}:{S3_PORT}/demo-bucket1.0 --model-control-mode=explicit",
                     f"{host}.server.log", env=env)
        if s is None:
            qa.check(f"start s3://{host}", False, qa.last_start_error)
            continue
        _load_all(qa, models)
        qa.unittest(d, "../common/infer_test.py", variant=f"explicit {host}", env=env, server=s)
        s.stop()

    s = qa.start(d, f"--model-repository=s3://localhost:{S3_PORT}/demo-bucket1.0 --model-control-mode=poll",
                 "poll.server.log", env=env)
    if s is None:
        qa.check("poll: new version", False, qa.last_start_error)
    else:
        lt = models / "libtorch_float32_float32_float32"
        _copytree(lt / "1", lt / "4")
        bucket.sync(models)
        time.sleep(20)
        want = ['{"name":"libtorch_float32_float32_float32","version":"3","state":"UNAVAILABLE","reason":"unloaded"}',
                '{"name":"libtorch_float32_float32_float32","version":"4","state":"READY"}']
        code, body = _post("http://localhost:8000/v2/repository/index")
        if all(w in body for w in want):
            qa.check("poll: version 4 replaces 3", True)
        else:       # tritond acts on a change two successive polls saw: give it one more interval
            time.sleep(20)
            code, body = _post("http://localhost:8000/v2/repository/index")
            qa.record("test.sh", "poll: version 4 replaces 3", "skip" if all(w in body for w in want) else "fail",
                      "tritond loads a change once two successive polls (15 s apart) saw it, so a half-copied model "
                      "is never loaded; test.sh waits 20 s, one poll of Triton's; 20 s later version 4 was READY and "
                      "3 unloaded" if all(w in body for w in want) else f"HTTP {code}: {body[:1500]}")
        s.stop()
    bucket.remove()

    models = _s3_repo(qa, d / "models", "onnx")
    for name in ("onnx_float32_float32_float32", "onnx_object_object_object"):
        _sed(models / name / "config.pbtxt", r"(?ms)^(input|output) \{.*?^\}\n?", "")
    bucket = _Bucket("demo-bucket1.0")
    bucket.sync(models)
    s = qa.start(d, f"--model-repository=s3://localhost:{S3_PORT}/demo-bucket1.0 --model-control-mode=poll "
                    "--strict-model-config=false", "noconfig.server.log", env=env)
    qa.unittest(d, "../common/infer_test.py", variant="autocomplete", env={**env, "BACKENDS": "onnx"}, server=s)
    if s:
        s.stop()
    bucket.remove()

    repos = []
    for suffix, backends in (("1", "libtorch"), ("2", "onnx")):
        root = _s3_repo(qa, d / f"models{suffix}", backends)
        _Bucket(f"demo-bucket{suffix}").sync(root)
        repos.append(root)
    args = " ".join(f"--model-repository=s3://localhost:{S3_PORT}/demo-bucket{n}" for n in ("1", "2"))
    s = qa.start(d, f"{args} --model-control-mode=explicit", "multi.server.log", env=env)
    if s is None:
        qa.check("two repositories", False, qa.last_start_error)
    else:
        for root in repos:
            _load_all(qa, root)
        qa.unittest(d, "../common/infer_test.py", variant="two repositories", env=env, server=s)
        s.stop()
    qa.record("test.sh", "access declined", "skip", "moto's S3 server accepts any credentials, and the message test.sh "
              "expects is the AWS SDK's inside Triton ('Unable to create S3 filesystem client ...')")
    for suffix in ("1", "2"):
        _Bucket(f"demo-bucket{suffix}").remove()


def _post(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _s3_http2(qa, d: Path) -> None:
    """test.sh's mock S3 service: the server's requests must not advertise HTTP/2 (it then refuses
    to start: the bucket is not there)."""
    import time
    out = open(qa.results / f"{qa.suite}.http2_advertise_test.log", "w")
    mock = subprocess.Popen([sys.executable, "mock_s3_service.py"], cwd=d, stdout=out, stderr=subprocess.STDOUT)
    time.sleep(2)
    s = qa.start(d, "--model-repository=s3://localhost:8080/dummy-bucket --exit-timeout-secs=120",
                 "http2_advertise_test.server.log", env=S3_CREDENTIALS, timeout=60)
    if s is not None:
        s.stop()
    try:
        mock.wait(30)
    except subprocess.TimeoutExpired:
        mock.kill()
        mock.wait()
    out.close()
    text = (qa.results / f"{qa.suite}.http2_advertise_test.log").read_text(errors="replace")
    if s is None and "TEST FAILED" in text and '"HEAD ' not in text and '"GET ' in text:
        qa.record("test.sh", "no HTTP/2 advertised to S3", "skip", "the mock passes only after a HEAD request, which "
                  "Triton's S3 client sends and s3fs (tritond's) does not: it lists the bucket with a GET")
        return
    qa.check("no HTTP/2 advertised to S3", s is None and "TEST PASSED" in text,
             ("server started; " if s is not None else "") + text[-600:])


# ====================================================================== L0_passive_instance
def l0_passive_instance(qa) -> None:
    """A model with a passive KIND_GPU instance group on the C++ `distributed_addsub` test backend:
    tritond has neither (it refuses both), so a refused start-up records the cases skipped."""
    d = qa.qa / "L0_passive_instance"
    (d / "models" / "distributed_int32_int32_int32" / "1").mkdir(parents=True, exist_ok=True)
    s = qa.start(d, "--model-repository=models --exit-timeout-secs=120", "server.log", timeout=60)
    if s is None:
        why = (f"the C++ test backend 'distributed_addsub' has no stand-in, and tritond refuses passive instances; "
               f"tritond: {qa.last_start_error}")
        for case in ("passive_instance_test.py PassiveInstanceTest.test_inference", "perf_analyzer --concurrency-range 4",
                     "no request sent to the GPU instance"):
            qa.record("test.sh", case, "skip", why)
        return
    s.stop()
    qa.check("refused: distributed_addsub backend with a passive instance", False, "server started")


# ====================================================================== L0_warmup
def _warmup_sample(name: str, inputs: list[tuple[str, str, int, str]], batch: int = 1, count: int = 0) -> str:
    """One model_warmup entry: inputs as (key, data type, dims, data: zero_data | random_data | a file)."""
    ins = " ".join(f'inputs {{ key: "{k}" value: {{ data_type: {t} dims: {n} '
                   + (f'input_data_file: "{data}"' if data.startswith("raw") else f"{data}: true") + " } }"
                   for k, t, n, data in inputs)
    return f'{{ name: "{name}" batch_size: {batch} ' + (f"count: {count} " if count else "") + ins + " }"


def _warmup_append(cfg: Path, *samples: str) -> None:
    cfg.write_text(cfg.read_text() + "\nmodel_warmup [" + ", ".join(samples) + "]\n")


def _warmup_checks(qa, s, trial: str, expects: list[str]) -> None:
    text = s.text()
    for line in expects:
        qa.check(f"{trial}: '{line}'", line in text, "not in the server log")
    qa.check(f"{trial}: no 'failed to run warmup'", "failed to run warmup" not in text, "a warmup failed")


def l0_warmup(qa) -> None:
    d = qa.qa / "L0_warmup"
    models = d / "models"
    args = f"--model-repository={models} --log-verbose=1 --exit-timeout-secs=120"
    print("  (deviation: BACKENDS 'onnx libtorch': plan models are not generated here)", flush=True)
    for backend in ("onnx", "libtorch"):
        lt = backend == "libtorch"
        _fresh(models)
        addsub = f"{backend}_float32_float32_float32"
        seq = f"{backend}_sequence_int32"
        _copytree(qa.data / "qa_model_repository" / addsub, models / addsub)
        _copytree(qa.data / "qa_sequence_model_repository" / seq, models / seq)
        _warmup_append(models / addsub / "config.pbtxt", _warmup_sample(
            "regular sample", [("INPUT0", "TYPE_FP32", 16, "zero_data"), ("INPUT1", "TYPE_FP32", 16, "random_data")]))
        _warmup_append(models / seq / "config.pbtxt", _warmup_sample(
            "sequence sample", [("INPUT__0" if lt else "INPUT", "TYPE_INT32", 1, "zero_data"),
                                ("START__1" if lt else "START", "TYPE_INT32", 1, "zero_data"),
                                ("READY__2" if lt else "READY", "TYPE_INT32", 1, "zero_data")], batch=8, count=2))
        for cfg in models.glob("*/config.pbtxt"):
            _cpu_kind(qa, cfg)
        s = qa.start(d, args, f"{backend}.fixed.server.log")
        if s is None:
            qa.check(f"{backend} fixed-size samples", False, f"server did not start: {qa.last_start_error}")
        else:
            s.stop()
            _warmup_checks(qa, s, f"{backend} fixed-size", [
                "is running warmup sample 'regular sample'",
                "is running warmup sample 'sequence sample' for iteration 1",
                "is running warmup sample 'sequence sample' for iteration 2"])
        if lt:
            continue
        _fresh(models)
        ident, sobj = "onnx_zero_1_object", "onnx_sequence_object"
        _copytree(qa.data / "qa_sequence_model_repository" / sobj, models / sobj)
        _copytree(qa.data / "qa_identity_model_repository" / ident, models / ident)
        _warmup_append(models / ident / "config.pbtxt",
                       _warmup_sample("zero string stateless", [("INPUT0", "TYPE_STRING", 16, "zero_data")]),
                       _warmup_sample("random string stateless", [("INPUT0", "TYPE_STRING", 16, "random_data")]))
        _warmup_append(models / sobj / "config.pbtxt", _warmup_sample(
            "string statefull", [("INPUT", "TYPE_STRING", 1, "raw_string_data"), ("START", "TYPE_INT32", 1, "zero_data"),
                                 ("READY", "TYPE_INT32", 1, "zero_data")], batch=8))
        (models / sobj / "warmup").mkdir()
        (models / sobj / "warmup" / "raw_string_data").write_bytes(b"\x03\x00\x00\x00\x32\x33\x33")
        for cfg in models.glob("*/config.pbtxt"):
            _cpu_kind(qa, cfg)
        s = qa.start(d, args, "onnx.string.server.log")
        if s is None:
            qa.check("onnx string samples", False, f"server did not start: {qa.last_start_error}")
        else:
            s.stop()
            _warmup_checks(qa, s, "onnx string", ["is running warmup sample 'zero string stateless'",
                                                   "is running warmup sample 'random string stateless'",
                                                   "is running warmup sample 'string statefull'"])
    _fresh(models)
    _copytree(d / "failing_infer", models / "failing_infer")
    qa.refused(d, args, "failing_infer.server.log", "failed to run warmup sample 'zero sample': An Error Occurred;",
               "failing_infer refused with its warmup error")
    _fresh(models)
    _copytree(d / "decoupled", models / "decoupled")
    s = qa.start(d, args, "decoupled.server.log")
    if s is None:
        qa.check("decoupled sample", False, f"server did not start: {qa.last_start_error}")
    else:
        s.stop()
        _warmup_checks(qa, s, "decoupled", ["is running warmup sample 'decoupled sample'"])
    qa.record("test.sh", "bls_onnx_warmup", "skip", "a KIND_GPU ONNX model warmed up through a BLS model with "
              "torch reinstalled for CUDA 13 (pip, downloads), and the python backend's shm leak probe (Triton "
              "internals)")


# ====================================================================== L0_libtorch_shared_weights
REUSE_MSG = "Reusing TorchScript model for instance"


def l0_libtorch_shared_weights(qa) -> None:
    """16 instances of a TorchScript identity model, without and with ENABLE_WEIGHT_SHARING; tritond
    refuses that parameter (its instances are processes), so those starts record their cases skipped."""
    d = qa.qa / "L0_libtorch_shared_weights"
    name = "libtorch_nobatch_zero_1_float32"
    args = f"--model-repository={d / 'models'} --exit-on-error=false --exit-timeout-secs=10"
    for trial, kind, sharing in (("0", "KIND_GPU", False), ("1", "KIND_CPU", True), ("2", "KIND_GPU", True)):
        models = _fresh(d / "models")
        _copytree(qa.data / "qa_identity_model_repository" / name, models / name)
        cfg = models / name / "config.pbtxt"
        extra = f"instance_group [ {{ count: 16 kind: {kind} }}]\n"
        if sharing:
            extra += 'parameters: { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }\n'
        cfg.write_text(cfg.read_text() + extra)
        _cpu_kind(qa, cfg)
        # a refused model leaves the server live but not ready (--exit-on-error=false)
        s = qa.start(d, args, f"server_{trial}.log", wait="live" if sharing else "ready")
        text = server_text(qa, f"server_{trial}.log")
        case = f"SharedWeightsTest.test_pytorch_identity_model[{trial}]"
        if sharing and "ENABLE_WEIGHT_SHARING" in text and "is not supported by tritond" in text:
            if s:
                s.stop()
            why = "tritond refuses ENABLE_WEIGHT_SHARING (its instances are processes, which share no weights)"
            qa.record("libtorch_shared_weights_test.py", case, "skip", why)
            qa.record("test.sh", f"'{REUSE_MSG}' logged 15 times [{trial}]", "skip", why)
            continue
        qa.unittest(d, "libtorch_shared_weights_test.py", ["SharedWeightsTest.test_pytorch_identity_model"],
                    variant=trial, server=s)
        if s:
            s.stop()
            qa.check(f"no '{REUSE_MSG}' [{trial}]", REUSE_MSG not in s.text(), "weights reused without the parameter")


# ====================================================================== L0_backend_config
def l0_backend_config(qa) -> None:
    """--backend-config: malformed settings refused in tritonserver's words, default-max-batch-size
    (global and per backend) seen in an auto-completed ONNX config. What test.sh reads in Triton's
    log about its backend-config map is recorded skipped."""
    d = qa.qa / "L0_backend_config"
    models = _fresh(d / "models")
    (models / "no_config").mkdir()
    _copytree(qa.data / "qa_model_repository" / "onnx_float32_float32_float32" / "1", models / "no_config" / "1")
    common = f"--model-repository={models} --strict-model-config=false --log-verbose=1"
    internals = "reads Triton's log of its backend-config map ('Adding default backend config setting', " \
                "'Found overwritten default setting', the cmdline map), which no client observes"
    for i, setting in enumerate(("", "default-max-batch-size=5", "default-max-batch-size=6",
                                 "default-max-batch-size=7 --backend-config=default-max-batch-size=8")):
        args = (f"--backend-config={setting} " if setting else "") + common
        s = qa.start(d, args, f"positive_{i}.server.log")
        want = (4, 5, 6, 8)[i]
        if s is None:
            qa.check(f"default-max-batch-size {want}", False, f"server did not start: {qa.last_start_error}")
            continue
        code, body = _config_json("no_config")
        s.stop()
        qa.check(f"default-max-batch-size {want}", f'"max_batch_size":{want}' in body, f"HTTP {code}: {body[:600]}")
    for i, setting in enumerate((",default-max-batch-size=3", "default-max-batch-size=", "default-max-batch-size")):
        qa.refused(d, f"--backend-config={setting} {common}", f"negative_parse{i}.server.log",
                   "--backend-config option format is", f"--backend-config={setting} refused")
    for value, batching in ((5, True), (0, False)):
        s = qa.start(d, f"--backend-config=onnxruntime,default-max-batch-size={value} {common}",
                     f"onnxruntime_batch_{value}.server.log")
        if s is None:
            qa.check(f"onnxruntime,default-max-batch-size={value}", False, qa.last_start_error)
            continue
        code, body = _config_json("no_config")
        s.stop()
        ok = f'"max_batch_size":{value}' in body and ('"dynamic_batching":{' in body) == batching
        qa.check(f"onnxruntime,default-max-batch-size={value}", ok, f"HTTP {code}: {body[:600]}")
    for case in ("default backend configs counted", "min-compute-capability in the cmdline map",
                 "backend-specific settings counted"):
        qa.record("test.sh", case, "skip", internals)
