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


def _repositories(qa, d: Path, implicit: bool, trials: list[str]) -> None:
    fixed = qa.data / ("qa_sequence_implicit_model_repository" if implicit else "qa_sequence_model_repository")
    var = qa.data / ("qa_variable_sequence_implicit_model_repository" if implicit
                     else "qa_variable_sequence_model_repository")
    backends = SEQUENCE_BACKENDS.split()
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
    _repositories(qa, d, implicit, trials)
    base = {"BACKENDS": SEQUENCE_BACKENDS, "ENSEMBLES": "0", "IMPLICIT_STATE": "1" if implicit else "0",
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
    """test.sh with IMPLICIT_STATE=1 (as Triton's CI job L0_sequence_batcher_implicit_state)."""
    _sequence_batcher(qa, implicit=True)


def l0_http_generate(qa) -> None:
    """L0_http's generate endpoint test (mock_llm, a decoupled python model)."""
    d = qa.qa / "L0_http"
    s = qa.start(d, f"--model-repository={qa.qa / 'python_models' / 'generate_models'} --log-verbose=1",
                 "generate.server.log")
    qa.unittest(d, "generate_endpoint_test.py", server=s)
    if s:
        s.stop()
