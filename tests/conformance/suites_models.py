"""L0_infer and L0_batcher (the model matrix and the dynamic batcher), L0_lifecycle's start-up
and model-control cases. See qa_suites.py."""
from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

from suites_http import BACKEND_DIR, _append, _copytree, _fresh, _note, _python_from_onnx, _sed

# test.sh serves every backend from one repository; that is about 15 GB of worker memory here
# (a TorchScript or dlpack worker holds some 160 MB), so each group gets its own server.
INFER_GROUPS = ("onnx libtorch", "python", "python_dlpack")
BATCHER_BACKENDS = "onnx libtorch python"


def _gpu_count() -> int:
    from tritond.repository.devices import gpu_count
    return gpu_count()


def _cpu_kind(qa, cfg: Path) -> None:
    """On a host without GPUs, a custom (identity) model test.sh puts on KIND_GPU runs on KIND_CPU."""
    if _gpu_count() == 0 and "KIND_GPU" in cfg.read_text():
        _sed(cfg, "KIND_GPU", "KIND_CPU")
        print(f"  (deviation: {cfg.parent.name}: KIND_GPU -> KIND_CPU, no GPU on this host)", flush=True)


# ====================================================================== L0_infer
def _infer_repository(qa, d: Path, group: str) -> Path:
    models = _fresh(d / "models")
    qa_models = qa.data / "qa_model_repository"
    backends = group.split()
    for backend in backends:
        if backend in ("python", "python_dlpack"):
            for onnx_model in sorted(qa_models.glob("onnx_*")):
                if "bf16" not in onnx_model.name:
                    _python_from_onnx(qa, onnx_model, models, backend)
        else:
            for src in sorted(qa_models.glob(f"{backend}*")):
                _copytree(src, models / src.name)
            for bf16 in models.glob("onnx_*bf16*"):
                shutil.rmtree(bf16)
    ens = qa.data / "qa_ensemble_model_repository" / "qa_model_repository"
    for backend in ("onnx", "libtorch"):
        for src in sorted(ens.glob(f"*{backend}*")) if backend in backends else ():
            _copytree(src, models / src.name)
    for src in sorted(ens.glob("nop_*")):
        _copytree(src, models / src.name)
        (models / src.name / "1").mkdir(exist_ok=True)
    extra = []
    if "onnx" in backends:
        extra = ["wrong_label_int32_float32_float32", "label_override_int32_float32_float32",
                 "mix_type_int32_float32_float32", "batch_to_nobatch_float32_float32_float32",
                 "batch_to_nobatch_nobatch_float32_float32_float32", "nobatch_to_batch_float32_float32_float32",
                 "nobatch_to_batch_nobatch_float32_float32_float32", "mix_nobatch_batch_float32_float32_float32"]
        if "libtorch" in backends:
            extra += ["mix_platform_float32_float32_float32", "mix_ensemble_int32_float32_float32"]
    for em in extra:
        _copytree(qa.qa / "ensemble_models" / em, models / em)
        (models / em / "1").mkdir(exist_ok=True)
    for fw in backends:
        for mc in sorted(glob.glob(str(models / f"{fw}*" / "config.pbtxt"))):
            _append(Path(mc), "instance_group [ { kind: KIND_CPU }]")
    _copytree(qa.qa / "custom_models" / "custom_zero_1_float32", models / "custom_zero_1_float32")
    (models / "custom_zero_1_float32" / "1").mkdir(exist_ok=True)
    _append(models / "custom_zero_1_float32" / "config.pbtxt", "instance_group [ { kind: KIND_CPU }]")
    _copytree(models / "custom_zero_1_float32", models / "custom_nobatch_zero_1_float32")
    cfg = models / "custom_zero_1_float32" / "config.pbtxt"
    _sed(cfg, "max_batch_size: 1", "max_batch_size: 8")
    _sed(cfg, r"dims: \[ 1 \]", "dims: [ -1 ]")
    cfg = models / "custom_nobatch_zero_1_float32" / "config.pbtxt"
    _sed(cfg, "custom_zero_1_float32", "custom_nobatch_zero_1_float32")
    _sed(cfg, "max_batch_size: 1", "max_batch_size: 0")
    _sed(cfg, r"dims: \[ 1 \]", "dims: [ -1, -1 ]")
    return models


def l0_infer(qa) -> None:
    d = qa.qa / "L0_infer"
    _note(qa, "plan and openvino models, the gpu target, valgrind")
    print(f"  (deviation: one server per backend group {INFER_GROUPS}, to bound worker memory)", flush=True)
    extra = (f"--exit-timeout-secs=600 --backend-directory={BACKEND_DIR} "
             f"--backend-config=python,stub-timeout-seconds=120 --backend-config=python,shm-default-byte-size=1048576")
    for group in INFER_GROUPS:
        _infer_repository(qa, d, group)
        env = {"BACKENDS": group, "ENSEMBLES": "1", "NOBATCH": "1", "BATCH": "1", "TRITON_SERVER_CPU_ONLY": "1"}
        s = qa.start(d, f"--model-repository={d / 'models'} {extra}", f"cpu.{group.replace(' ', '_')}.server.log",
                     timeout=900)
        qa.unittest(d, "infer_test.py", env=env, server=s, variant=group)
        if s:
            s.stop()


# ====================================================================== L0_batcher
NO_DELAY_TESTS = ["test_static_batch_preferred", "test_static_batch_lt_any_preferred", "test_static_batch_not_preferred",
                  "test_static_batch_gt_max_preferred", "test_multi_batch_not_preferred", "test_multi_batch_gt_max_preferred",
                  "test_multi_batch_sum_gt_max_preferred", "test_multi_same_output0", "test_multi_same_output1",
                  "test_multi_different_outputs", "test_multi_different_output_order"]
DELAY_TESTS = {"test_multi_batch_delayed_sum_gt_max_preferred": 2, "test_multi_batch_use_biggest_preferred": 6,
               "test_multi_batch_use_best_preferred": 3, "test_multi_batch_delayed_use_max_batch": 3}
DIFFERENT_SHAPE_TESTS = ["test_multi_batch_not_preferred_different_shape", "test_multi_batch_preferred_different_shape",
                         "test_multi_batch_different_shape_allow_ragged", "test_multi_batch_different_shape"]
PREFERRED_BATCH_ONLY_TESTS = {"test_preferred_batch_only_aligned": 4, "test_preferred_batch_only_unaligned": 5,
                              "test_preferred_batch_only_use_biggest_preferred": 7,
                              "test_preferred_batch_only_use_no_preferred_size": 3}
MAX_QUEUE_DELAY_ONLY_TESTS = {"test_max_queue_delay_only_default": 0, "test_max_queue_delay_only_non_default": 20000}


def _batcher_repo(qa, d: Path, name: str, source: str, dynamic: str, variable: bool = False) -> Path:
    repo = _fresh(d / name)
    for backend in BATCHER_BACKENDS.split():
        src = qa.data / source / f"{backend}_float32_float32_float32"
        if backend == "python":
            dest = _python_from_onnx(qa, qa.data / source / "onnx_float32_float32_float32", repo, "python",
                                     platform_to_backend=True, swap=False)
        else:
            dest = repo / src.name
            _copytree(src, dest)
        cfg = dest / "config.pbtxt"
        _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 8")
        _sed(cfg, r"(?m)^version_policy:.*", "version_policy: { specific { versions: [1] }}")
        _append(cfg, dynamic)
        if variable:
            _sed(cfg, "16", "-1")
    return repo


def _ragged_identity(qa, var: Path) -> None:
    ident = qa.data / "qa_identity_model_repository"
    dyn = "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }"
    _copytree(qa.qa / "custom_models" / "custom_zero_1_float32", var / "custom_zero_1_float32")
    cfg = var / "custom_zero_1_float32" / "config.pbtxt"
    (var / "custom_zero_1_float32" / "1").mkdir(exist_ok=True)
    _append(cfg, "instance_group [ { kind: KIND_GPU count: 1 }]")
    _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 8")
    _sed(cfg, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(cfg, r'name:.*"INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true')
    _sed(cfg, r"(?m)^version_policy:.*", "version_policy: { specific { versions: [1] }}")
    _append(cfg, dyn)
    _cpu_kind(qa, cfg)
    for backend, inp, out in (("onnx", "INPUT0", "OUTPUT0"), ("libtorch", "INPUT__0", "OUTPUT__0")):
        dest = var / f"{backend}_zero_1_float32"
        _copytree(ident / f"{backend}_nobatch_zero_1_float32", dest)
        cfg = dest / "config.pbtxt"
        _sed(cfg, "nobatch_", "")
        _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 8")
        _sed(cfg, f'name: "{inp}"', f'name: "{inp}"\nallow_ragged_batch: true')
        _append(cfg, f'batch_output [{{target_name: "{out}" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
                     f'source_input: "{inp}" }}] {dyn}')


def _custom_zero(qa, d: Path, max_batch_size: int) -> Path:
    """test.sh's fresh custom_models/custom_zero_1_float32 with a variable dim; its config."""
    model = _fresh(d / "custom_models") / "custom_zero_1_float32"
    _copytree(qa.qa / "custom_models" / "custom_zero_1_float32", model)
    (model / "1").mkdir(exist_ok=True)
    cfg = model / "config.pbtxt"
    _sed(cfg, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(cfg, r"max_batch_size:.*", f"max_batch_size: {max_batch_size}")
    return cfg


def _one(qa, d: Path, repo: str, test: str, variant: str, env: dict[str, str], log: str, extra: str = "") -> None:
    s = qa.start(d, f"{extra}--model-repository={d / repo} --backend-directory={BACKEND_DIR}", log, env=env)
    qa.unittest(d, "batcher_test.py", [f"BatcherTest.{test}"], variant=variant, env=env, server=s)
    if s:
        s.stop()


def l0_batcher(qa) -> None:
    d = qa.qa / "L0_batcher"
    _note(qa, "plan models, valgrind, instance_queue_test (C++ program)")
    dyn = "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }"
    _batcher_repo(qa, d, "models", "qa_model_repository", dyn)
    _batcher_repo(qa, d, "preferred_batch_only_models", "qa_model_repository",
                  "dynamic_batching { preferred_batch_size: [ 4, 6 ] }")
    var = _batcher_repo(qa, d, "var_models", "qa_variable_model_repository", dyn, variable=True)
    _ragged_identity(qa, var)
    base = {"BACKENDS": BATCHER_BACKENDS}
    for model_type, repo in (("FIXED", "models"), ("VARIABLE", "var_models")):
        env = dict(base, BATCHER_TYPE=model_type)
        for test in NO_DELAY_TESTS:
            _one(qa, d, repo, test, model_type, env, f"{test}.{model_type}.server.log")
        for test, delay in DELAY_TESTS.items():
            _one(qa, d, repo, test, model_type, dict(env, TRITONSERVER_DELAY_SCHEDULER=str(delay)),
                 f"{test}.{model_type}.server.log")
    env = dict(base, BATCHER_TYPE="VARIABLE")
    for test in DIFFERENT_SHAPE_TESTS:
        _one(qa, d, "var_models", test, "VARIABLE", env, f"{test}.VARIABLE.server.log")
    _one(qa, d, "var_models", "test_multi_batch_delayed_preferred_different_shape", "VARIABLE",
         dict(env, TRITONSERVER_DELAY_SCHEDULER="4"), "delayed_preferred_different_shape.server.log")
    env = dict(base, BATCHER_TYPE="FIXED")
    for test, delay in PREFERRED_BATCH_ONLY_TESTS.items():
        _one(qa, d, "preferred_batch_only_models", test, "FIXED", dict(env, TRITONSERVER_DELAY_SCHEDULER=str(delay)),
             f"{test}.PREFERRED_BATCH_ONLY.server.log")

    cfg = _custom_zero(qa, d, 100)
    _append(cfg, "dynamic_batching { max_queue_delay_microseconds: 0}\ninstance_group [ { kind: KIND_GPU } ]\n"
                 'parameters [\n{ key: "execute_delay_ms"; value: { string_value: "100" }}\n]')
    _cpu_kind(qa, cfg)
    for test, delay in MAX_QUEUE_DELAY_ONLY_TESTS.items():
        # test.sh's sed here matches nothing (it looks for '[...]' after the delay): the config keeps 0.
        _one(qa, d, "custom_models", test, "MAX_QUEUE_DELAY_ONLY", dict(base, MAX_QUEUE_DELAY_MICROSECONDS=str(delay)),
             f"{test}.MAX_QUEUE_DELAY_ONLY.server.log")

    # preserve_ordering, checked from the trace file's timestamps
    cfg = _custom_zero(qa, d, 4)
    _append(cfg, "dynamic_batching { preferred_batch_size: [ 4 ] }\ninstance_group [ { kind: KIND_GPU count: 2 }]\n"
                 'parameters [\n{ key: "execute_delay_ms"; value: { string_value: "100" }},\n'
                 '{ key: "instance_wise_delay_multiplier"; value: { string_value: "4" }}\n]')
    _cpu_kind(qa, cfg)
    env = dict(base, TRITONSERVER_DELAY_SCHEDULER="12")
    for label, flag in (("not_preserve", []), ("preserve", ["-p"])):
        if label == "preserve":
            _sed(cfg, r"dynamic_batching.*", "dynamic_batching { preferred_batch_size: [ 4 ] preserve_ordering: true }")
        trace = d / f"{label}.log"
        trace.unlink(missing_ok=True)
        _one(qa, d, "custom_models", "test_multi_batch_preserve_ordering", label, env, f"{label}.server.log",
             extra=f"--trace-file={label}.log --trace-level=MIN --trace-rate=1 ")
        r = subprocess.run([sys.executable, "verify_timestamps.py", *flag, f"{label}.log"], cwd=d,
                           capture_output=True, text=True)
        qa.check(f"verify_timestamps {' '.join(flag)} {label}.log", r.returncode == 0, (r.stdout + r.stderr)[-500:])

    # queue timeout
    models = _fresh(d / "models")
    (models / "dynamic_batch" / "1").mkdir(parents=True)
    (models / "dynamic_batch" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 1\n'
        'input [{ name: "INPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        "instance_group [{ count: 1 \n kind: KIND_CPU }]\n"
        "dynamic_batching {\n  preferred_batch_size: [ 1 ]\n"
        "  default_queue_policy { timeout_action: REJECT \n default_timeout_microseconds: 1000000 \n max_queue_size: 8 }\n"
        "}\n"
        'parameters [{ key: "execute_delay_ms" \n value: { string_value: "8000" } }]\n')
    s = qa.start(d, f"--model-repository={models} --log-verbose=2 --backend-directory={BACKEND_DIR}",
                 "queue_timeout.server.log")
    qa.unittest(d, "queue_timeout_test.py", server=s)
    if s:
        s.stop()


# ====================================================================== L0_lifecycle
def l0_lifecycle(qa) -> None:
    from suites_lifecycle import run
    run(qa)


# ====================================================================== L0_batch_input
def l0_batch_input(qa) -> None:
    d = qa.qa / "L0_batch_input"
    _note(qa, "plan models")
    ragged, ident = qa.data / "qa_ragged_model_repository", qa.data / "qa_identity_model_repository"
    for backend in ("onnx", "libtorch"):
        models = _fresh(d / "models")
        for name, source, subs in (
                ("ragged_element_count_acc_zero", "batch_input", []),
                ("ragged_acc_shape", "batch_input",
                 [("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT"),
                  ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE")]),
                ("batch_item_flatten", "batch_input",
                 [("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT"),
                  ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_ITEM_SHAPE_FLATTEN")]),
                ("batch_item", "batch_item", [])):
            _copytree(ragged / f"{backend}_{source}", models / name)
            cfg = models / name / "config.pbtxt"
            _sed(cfg, f"{backend}_{source}", name)
            if name == "batch_item_flatten":
                _sed(cfg, "-1", "-1, -1", count=1)
            for old, new in subs:
                _sed(cfg, old, new)
        _copytree(ident / f"{backend}_nobatch_zero_1_float32", models / "ragged_io")
        cfg = models / "ragged_io" / "config.pbtxt"
        _sed(cfg, "__0", "0")
        _sed(cfg, f"{backend}_nobatch_zero_1_float32", "ragged_io")
        _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 4")
        _sed(cfg, 'name: "INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true')
        _append(cfg, 'batch_output [{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE '
                     'source_input: "INPUT0" }] dynamic_batching { max_queue_delay_microseconds: 1000000 }')
        s = qa.start(d, "--model-repository=models --exit-timeout-secs=120", f"{backend}.server.log")
        qa.unittest(d, "batch_input_test.py", server=s, variant=backend)
        if s:
            s.stop()
