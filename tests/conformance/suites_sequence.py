"""The stateful/streaming suites: L0_sequence_batcher (explicit and implicit state) for the CPU
backends tritond runs, and the generate endpoint test of L0_http.

L0_sequence_batcher's test.sh runs every case of five repositories (models0/1/2/4, the instance
count and batch size trials, and modelsv, the variable-shape one) with one server per case;
`QA_SEQUENCE_TRIALS` (default test.sh's "0 1 2 4 v") picks the trials, as test.sh's MODEL_TRIALS.
Left out, with the reason printed: the custom C++ sequence backend (ragged and request timeout
cases), plan models, and the ensembles (not generated here). On a host without GPUs the models'
KIND_GPU instance groups run on KIND_CPU (printed as a deviation).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from suites_http import BACKEND_DIR, _append, _copytree, _fresh, _note, _sed
from suites_models import _gpu_count

SEQUENCE_BACKENDS = "onnx libtorch python"
IMPLICIT_BACKENDS = "onnx libtorch"
NO_DELAY_TESTS = ("test_simple_sequence", "test_length1_sequence", "test_batch_size", "test_no_sequence_start",
                  "test_no_sequence_start2", "test_no_sequence_end", "test_no_correlation_id")
# test.sh's TRITONSERVER_DELAY_SCHEDULER and TRITONSERVER_BACKLOG_DELAY_SCHEDULER per case
DELAY_TESTS = {
    "test_backlog_fill": (10, 2), "test_backlog_fill_no_end": (10, 3),
    "test_backlog_same_correlation_id": (12, 2), "test_backlog_same_correlation_id_no_end": (16, 0),
    "test_backlog_sequence_timeout": (4, 0), "test_half_batch": (8, 0), "test_skip_batch": (12, 0),
    "test_full_batch": (12, 0), "test_ragged_batch": (12, 0), "test_backlog": (12, 0),
}
QUEUE_DELAY_TESTS = ("test_queue_delay_no_min_util", "test_queue_delay_half_min_util",
                     "test_queue_delay_full_min_util")
# trial -> (repository, max_batch_size (None: keep), instance count)
TRIALS = {"0": ("models0", None, 4), "1": ("models1", 4, 1), "2": ("models2", 2, 2), "4": ("models4", 1, 4),
          "v": ("modelsv", 4, 1)}


def _dtypes(backend: str, implicit: bool) -> list[str]:
    return ["object", "int32", "bool"] if implicit and backend in ("onnx", "libtorch") else ["int32", "bool"]


def _place(qa, src: Path, dest_root: Path) -> Path:
    """Copy one qa sequence model; python ones are made from the onnx model as generate_python_models."""
    if not src.name.startswith("python_"):
        dest = dest_root / src.name
        _copytree(src, dest)
        return dest
    onnx_model = Path(str(src).replace("python", "onnx"))
    dest = dest_root / src.name
    (dest / "1").mkdir(parents=True, exist_ok=True)
    text = re.sub(r"platform:.*", 'backend: "python"', (onnx_model / "config.pbtxt").read_text())
    (dest / "config.pbtxt").write_text(text.replace("onnx", "python"))
    shutil.copy(qa.qa / "python_models" / "sequence_int32" / "model.py", dest / "1")
    return dest


def _shape(cfg: Path, batch: int | None, count: int, cpu_only: bool) -> None:
    if batch is not None:
        _sed(cfg, r"(?m)^max_batch_size:.*", f"max_batch_size: {batch}")
    _sed(cfg, r"kind: (KIND_GPU|KIND_CPU)", rf"kind: \1\ncount: {count}")
    if cpu_only:
        _sed(cfg, "KIND_GPU", "KIND_CPU")


def _repositories(qa, d: Path, implicit: bool, trials: list[str], backends: list[str]) -> None:
    fixed = qa.data / ("qa_sequence_implicit_model_repository" if implicit else "qa_sequence_model_repository")
    var = qa.data / ("qa_variable_sequence_implicit_model_repository" if implicit
                     else "qa_variable_sequence_model_repository")
    cpu_only = _gpu_count() == 0
    if cpu_only:
        print("  (deviation: the sequence models' KIND_GPU instance groups run on KIND_CPU, no GPU on this host)",
              flush=True)
    for trial in trials:
        repo_name, batch, count = TRIALS[trial]
        repo = _fresh(d / repo_name)
        source = var if trial == "v" else fixed
        for backend in backends:
            for dtype in _dtypes(backend, implicit):
                name = f"{backend}_nobatch_sequence_{dtype}" if trial == "0" else f"{backend}_sequence_{dtype}"
                if backend == "libtorch" and dtype == "object" and trial != "0":
                    continue
                _shape(_place(qa, source / name, repo) / "config.pbtxt", batch, count, cpu_only)
    queue = _fresh(d / "queue_delay_models")
    for backend in backends:
        for dtype in _dtypes(backend, implicit):
            if backend == "libtorch" and dtype == "object":
                continue
            model = _place(qa, fixed / f"{backend}_sequence_{dtype}", queue)
            cfg = model / "config.pbtxt"
            _shape(cfg, 4, 1, cpu_only)
            _sed(cfg, r"sequence_batching \{",
                 "sequence_batching {\ndirect {\nmax_queue_delay_microseconds: 3000000\nminimum_slot_utilization: 0\n}",
                 count=1)
            for suffix, util in (("_half", "0.5"), ("_full", "1")):
                twin = queue / (model.name + suffix)
                _copytree(model, twin)
                _sed(twin / "config.pbtxt", model.name, twin.name, count=1)
                _sed(twin / "config.pbtxt", "minimum_slot_utilization: 0", f"minimum_slot_utilization: {util}")


def _case(qa, d: Path, repo: str, case: str, variant: str, env: dict[str, str]) -> None:
    s = qa.start(d, f"--model-repository={d / repo} --backend-directory={BACKEND_DIR} --log-verbose=1",
                 f"{case.split('.')[-1]}.{repo}.server.log", env=env)
    qa.unittest(d, "sequence_batcher_test.py", [case], variant=variant, env=env, server=s)
    if s:
        s.stop()


def _sequence_batcher(qa, implicit: bool) -> None:
    d = qa.qa / "L0_sequence_batcher"
    _note(qa, "custom (C++ test backend) and plan models: ragged batch and request timeout cases; ensembles")
    trials = os.environ.get("QA_SEQUENCE_TRIALS", "0 1 2 4 v").split()
    backends = IMPLICIT_BACKENDS if implicit else SEQUENCE_BACKENDS
    _repositories(qa, d, implicit, trials, backends.split())
    base = {"BACKENDS": backends, "ENSEMBLES": "0", "IMPLICIT_STATE": "1" if implicit else "0",
            "INITIAL_STATE_FILE": "0", "INITIAL_STATE_ZERO": "0", "USE_SINGLE_BUFFER": "0"}
    for trial in trials:
        repo = TRIALS[trial][0]
        env = dict(base, NO_BATCHING="1" if trial == "0" else "0",
                   MODEL_INSTANCES="1" if trial == "v" else ("4" if trial == "0" else trial),
                   BATCHER_TYPE="VARIABLE" if trial == "v" else "FIXED")
        for test in NO_DELAY_TESTS:
            _case(qa, d, repo, f"SequenceBatcherTest.{test}", repo, env)
        for test, (delay, backlog) in DELAY_TESTS.items():
            _case(qa, d, repo, f"SequenceBatcherTest.{test}", repo,
                  dict(env, TRITONSERVER_DELAY_SCHEDULER=str(delay), TRITONSERVER_BACKLOG_DELAY_SCHEDULER=str(backlog)))
    # test.sh runs these after its trial loop, with the last trial's ("v") instance count and type
    env = dict(base, NO_BATCHING="0", MODEL_INSTANCES="1", BATCHER_TYPE="VARIABLE",
               TRITONSERVER_DELAY_SCHEDULER="2", TRITONSERVER_BACKLOG_DELAY_SCHEDULER="0")
    for test in QUEUE_DELAY_TESTS:
        _case(qa, d, "queue_delay_models", f"SequenceBatcherTest.{test}", "queue_delay_models", env)
    if "python" in backends:        # test.sh's python-only subtests
        _preserve_ordering(qa, d, base)


def _preserve_ordering(qa, d: Path, base: dict[str, str]) -> None:
    repo = _fresh(d / "preserve_ordering_models")
    src = qa.qa / "python_models" / "sequence_py"
    for mode in ("decoupled", "nondecoupled"):
        for kind, value in (("no_preserve", "False"), ("preserve", "True")):
            model = repo / f"seqpy_{kind}_ordering_{mode}"
            (model / "1").mkdir(parents=True)
            shutil.copy(src / "config.pbtxt", model)
            shutil.copy(src / "model.py", model / "1")
            _sed(model / "config.pbtxt", r"(?m)^preserve_ordering: False", f"preserve_ordering: {value}")
            if mode == "decoupled":
                _append(model / "config.pbtxt", "\nmodel_transaction_policy { decoupled: true }")
    _case(qa, d, "preserve_ordering_models", "SequenceBatcherPreserveOrderingTest", "preserve_ordering",
          dict(base, NO_BATCHING="0", MODEL_INSTANCES="1", BATCHER_TYPE="VARIABLE"))


def l0_sequence_batcher(qa) -> None:
    _sequence_batcher(qa, implicit=False)


def l0_sequence_batcher_implicit(qa) -> None:
    """test.sh with IMPLICIT_STATE=1 (as Triton's CI job L0_sequence_batcher_implicit_state), for
    onnx and libtorch: the python sequence model keeps one accumulator in the model, not implicit
    state, so its batched trials cannot give the implicit variant's results (under Triton either;
    L0_dyna_implicit_state leaves python out too)."""
    _sequence_batcher(qa, implicit=True)


def l0_http_generate(qa) -> None:
    """L0_http's generate endpoint test (mock_llm, a decoupled python model)."""
    d = qa.qa / "L0_http"
    s = qa.start(d, f"--model-repository={qa.qa / 'python_models' / 'generate_models'} --log-verbose=1",
                 "generate.server.log")
    qa.unittest(d, "generate_endpoint_test.py", server=s)
    if s:
        s.stop()


# ====================================================================== L0_dyna_sequence_batcher
DYNA_NO_BATCHING_TESTS = ("test_simple_sequence", "test_length1_sequence")
DYNA_TESTS = ("test_multi_sequence_different_shape", "test_multi_sequence", "test_multi_parallel_sequence",
              "test_backlog", "test_backlog_fill", "test_backlog_fill_no_end", "test_backlog_sequence_timeout")


def l0_dyna_sequence_batcher(qa) -> None:
    """The oldest-first sequence batcher with CONTROL_SEQUENCE_CORRID, onnx and libtorch models
    (test.sh's IMPLICIT_STATE=0)."""
    _note(qa, "plan models; custom_dyna_sequence_int32 and custom_string_dyna_sequence_int32 (the C++ "
              "dyna_sequence test backend) with the ragged-batch case that needs them")
    _dyna_sequence_batcher(qa, "qa_dyna_sequence_model_repository", {"IMPLICIT_STATE": "0", "BACKENDS": "libtorch onnx"})


def l0_dyna_implicit_state(qa) -> None:
    """L0_dyna_sequence_batcher's test.sh with IMPLICIT_STATE=1 and its BACKENDS "onnx plan"."""
    _note(qa, "plan models (TensorRT)")
    _dyna_sequence_batcher(qa, "qa_dyna_sequence_implicit_model_repository", {"IMPLICIT_STATE": "1", "BACKENDS": "onnx"})


def _dyna_sequence_batcher(qa, repository: str, env: dict[str, str]) -> None:
    d = qa.qa / "L0_dyna_sequence_batcher"
    models = _fresh(d / "models")
    for src in sorted((qa.data / repository).iterdir()):
        if src.is_dir():
            _copytree(src, models / src.name)
            _sed(models / src.name / "config.pbtxt", "kind: KIND_CPU", "kind: KIND_CPU\ncount: 1")
    for test in DYNA_NO_BATCHING_TESTS:
        s = qa.start(d, f"--model-repository={models}", f"{test}.server.log", env=env)
        qa.unittest(d, "dyna_sequence_batcher_test.py", [f"DynaSequenceBatcherTest.{test}"],
                    env=dict(env, NO_BATCHING="1"), server=s)
        if s:
            s.stop()
    for m in models.iterdir():
        _sed(m / "config.pbtxt", r"max_candidate_sequences:.*", "max_candidate_sequences:4")
        _sed(m / "config.pbtxt", r"max_queue_delay_microseconds:.*", "max_queue_delay_microseconds:5000000")
    for test in DYNA_TESTS:
        s = qa.start(d, f"--model-repository={models}", f"{test}.server.log", env=env)
        qa.unittest(d, "dyna_sequence_batcher_test.py", [f"DynaSequenceBatcherTest.{test}"],
                    env=dict(env, NO_BATCHING="0"), server=s)
        if s:
            s.stop()


# ====================================================================== L0_sequence_corrid_batcher
def l0_sequence_corrid_batcher(qa) -> None:
    """Direct sequence batcher models4 (4 instances, max_batch_size 1) and the correlation id
    data types of CONTROL_SEQUENCE_CORRID. test.sh copies libtorch_dyna_sequence_int32 into models4
    too, though the test's trials never use it; so does this."""
    d = qa.qa / "L0_sequence_corrid_batcher"
    _note(qa, "plan_dyna_sequence_int32 (TensorRT)")
    models = _fresh(d / "models4")
    for backend in ("onnx", "libtorch"):
        m = models / f"{backend}_dyna_sequence_int32"
        _copytree(qa.data / "qa_dyna_sequence_model_repository" / m.name, m)
        cfg = m / "config.pbtxt"
        _sed(cfg, r"oldest.*\{.*\}.*control_input", "control_input", count=1, flags=re.S)
        _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 1")
        _sed(cfg, "kind: KIND_GPU", "kind: KIND_GPU\ncount: 4")
        _sed(cfg, "kind: KIND_CPU", "kind: KIND_CPU\ncount: 4")
    # the test's trials are ("plan", "onnx") with plan first: it runs onnx alone here
    print("  (deviation: test_skip_batch's trials are ('onnx',), its plan trial is a TensorRT model)", flush=True)
    base = {"NO_BATCHING": "0", "MODEL_INSTANCES": "4"}        # test.sh exports these once, for both parts
    env = dict(base, TRITONSERVER_BACKLOG_DELAY_SCHEDULER="0", TRITONSERVER_DELAY_SCHEDULER="12")
    s = qa.start(d, f"--model-repository={models}", "test_skip_batch.models4.server.log", env=env)
    qa.unittest(d, "sequence_corrid_batcher_test.py", ["SequenceCorrIDBatcherTest.test_skip_batch"],
                env=dict(env, QA_PATCH='{"_trials": ["onnx"]}'), server=s)
    if s:
        s.stop()

    repo = _fresh(d / "corrid_data_type")
    (repo / "add_sub" / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "add_sub" / "model.py", repo / "add_sub" / "1")
    for dtype in ("TYPE_STRING", "TYPE_UINT32", "TYPE_INT32", "TYPE_UINT64", "TYPE_INT64"):
        shutil.copy(qa.qa / "python_models" / "add_sub" / "config.pbtxt", repo / "add_sub")
        _append(repo / "add_sub" / "config.pbtxt",
                f'sequence_batching {{ control_input [{{ name: "CORRID" control [{{ '
                f'kind: CONTROL_SEQUENCE_CORRID data_type: {dtype} }}] }}] }}')
        env = dict(base, TRITONSERVER_CORRID_DATA_TYPE=dtype)
        s = qa.start(d, f"--model-repository={repo}", f"test_corrid_data_type.{dtype}.server.log", env=env)
        qa.unittest(d, "sequence_corrid_batcher_test.py", ["SequenceCorrIDBatcherTest.test_corrid_data_type"],
                    variant=dtype, env=env, server=s)
        if s:
            s.stop()


# ====================================================================== L0_implicit_state
IMPLICIT_STATE_BACKEND_TESTS = {
    "test_no_implicit_state": "no_implicit_state", "test_wrong_implicit_state_name": "wrong_internal_state",
    "test_implicit_state_single_buffer": "single_state_buffer",
    "test_implicit_state_growable_memory": "growable_memory", "test_no_update": "no_state_update"}


def l0_implicit_state(qa) -> None:
    """implicit_state.py over the onnx and libtorch nobatch sequence models (state not allowed as a
    requested output; then allowed, with the state declared as a model output). Its second part,
    L0_sequence_batcher with IMPLICIT_STATE=1, is the suite L0_sequence_batcher_implicit."""
    d = qa.qa / "L0_implicit_state"
    _note(qa, "plan models; the cases of models/no_implicit_state, wrong_internal_state, single_state_buffer, "
              "growable_memory and no_state_update (Triton's C++ implicit_state test backend, "
              "libtriton_implicit_state.so, whose behaviour each case is about)")
    models = _fresh(d / "qa_models")      # test.sh's models/ holds the C++ backend's models too
    backends = "onnx libtorch"
    cpu_only = _gpu_count() == 0
    if cpu_only:
        print("  (deviation: the sequence models' KIND_GPU instance groups run on KIND_CPU, no GPU on this host)",
              flush=True)
    for backend in backends.split():
        name = f"{backend}_nobatch_sequence_int32"
        src = qa.data / "qa_sequence_implicit_model_repository" / name
        _copytree(src, models / name)
        if cpu_only:
            _sed(models / name / "config.pbtxt", "KIND_GPU", "KIND_CPU")
        out = models / f"{name}_output"
        _copytree(models / name, out)
        _sed(out / "config.pbtxt", r"(?m)^name:.*", f'name: "{out.name}"')
        state = "OUTPUT_STATE__1" if backend == "libtorch" else "OUTPUT_STATE"
        _append(out / "config.pbtxt", f'output [{{ name: "{state}" \n data_type: TYPE_INT32 \n dims: [ 1 ] }}]')
    for case, model in IMPLICIT_STATE_BACKEND_TESTS.items():
        qa.record("implicit_state.py", f"ImplicitStateTest.{case}", "skip",
                  f"model '{model}' is Triton's C++ implicit_state test backend")
    env = {"BACKENDS": backends, "IMPLICIT_STATE": "1", "ENSEMBLES": "0", "INITIAL_STATE_ZERO": "0",
           "INITIAL_STATE_FILE": "0", "SINGLE_STATE_BUFFER": "0"}
    s = qa.start(d, f"--backend-directory={BACKEND_DIR} --model-repository={models} "
                    f"--cuda-virtual-address-size=0:{1024 * 1024 * 4}", "server.log", env=env)
    qa.unittest(d, "implicit_state.py", ["ImplicitStateTest.test_request_output_not_allowed",
                                         "ImplicitStateTest.test_request_output"], env=env, server=s)
    if s:
        s.stop()
