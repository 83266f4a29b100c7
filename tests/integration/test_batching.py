"""Batch formation, queue policies, instance groups and statistics, through tritonclient.

Determinism without wall-clock thresholds: a request carrying a `gate` parameter holds its
instance until the test creates the gate file; the test queues more requests behind it,
waits until the metrics endpoint shows them pending, and only then opens the gate. The
model reports the batch it ran in and monotonic start/end timestamps (CLOCK_MONOTONIC is
shared by every process), so tests assert on counts and orderings.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, TritondServer, metric, serving, wait_for

WAIT_S = 60.0

MODEL_PY = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def wait_for(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)


class TritonPythonModel:
    """Identity that reports its batch; parameters: gate (file to wait for), started
    (file to create on start), sleep_ms (take this long), fail (answer this request with an
    error)."""

    def execute(self, requests):
        start = time.monotonic_ns()
        params = [json.loads(r.parameters() or "{}") for r in requests]
        for p in params:
            if "started" in p:
                open(p["started"], "w").close()
        for p in params:
            if "gate" in p:
                wait_for(p["gate"])
            time.sleep(p.get("sleep_ms", 0) / 1000)
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        n_elements = sum(x.shape[0] for x in inputs)
        end = time.monotonic_ns()
        responses = []
        for x, p in zip(inputs, params):
            if p.get("fail"):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            rows = (x.shape[0], 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("BATCH_SIZE", np.full(rows, len(requests), np.int32)),
                pb_utils.Tensor("BATCH_ELEMENTS", np.full(rows, n_elements, np.int32)),
                pb_utils.Tensor("START_NS", np.full(rows, start, np.int64)),
                pb_utils.Tensor("END_NS", np.full(rows, end, np.int64)),
            ]))
        return responses
'''

IO = '''
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }},
  {{ name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH_ELEMENTS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START_NS" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "END_NS" data_type: TYPE_INT64 dims: [ 1 ] }}
]
'''

MODELS = {
    # Long delay, preferred = [max_batch_size]: a short queue waits the whole delay.
    "gated": ("max_batch_size: 8", "4", "dynamic_batching { max_queue_delay_microseconds: 1000000 }", 1),
    "pref": ("max_batch_size: 8", "4",
             "dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 60000000 }", 1),
    "shapes": ("max_batch_size: 8", "-1", "dynamic_batching { }", 1),
    "policy": ("max_batch_size: 1", "4", """dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 2 timeout_action: REJECT
                         default_timeout_microseconds: 60000000 allow_timeout_override: true }
  priority_queue_policy { key: 1 value { timeout_action: DELAY
                          default_timeout_microseconds: 60000000 allow_timeout_override: true } }
}""", 1),
    "turn": ("max_batch_size: 8", "4", "dynamic_batching { }", 1),
    "ordered": ("max_batch_size: 4", "4", "dynamic_batching { preserve_ordering: true }", 2),
    "unordered": ("max_batch_size: 4", "4", "dynamic_batching { }", 2),
    "nobatch": ("max_batch_size: 8", "4", "", 1),
}

ADVICE_CONFIG = '''name: "needs_batching"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
ADVICE = ("model 'needs_batching': input 'INPUT0' has a variable first dimension but max_batch_size is 0; "
          "set max_batch_size > 0 and add `dynamic_batching { }` to let the server batch requests")

ONNX_CONFIG = '''name: "mlp_pref6"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 60000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


# Both steps read the ensemble's input, so the broker admits them to `turn` in one loop turn.
FANOUT_CONFIG = '''name: "fanout"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "SIZE_A" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SIZE_B" data_type: TYPE_INT32 dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "turn" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "A" } output_map { key: "BATCH_SIZE" value: "SIZE_A" } },
  { model_name: "turn" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "B" } output_map { key: "BATCH_SIZE" value: "SIZE_B" } }
] }
'''


def build_repo(root: Path, example_repo: Path) -> Path:
    for name, (mbs, dims, batching, count) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{mbs}\n{IO.format(dims=dims)}\n{batching}\n'
            f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n")
    (root / "needs_batching" / "1").mkdir(parents=True)
    shutil.copy(example_repo / "identity_fp32" / "1" / "model.py", root / "needs_batching" / "1" / "model.py")
    (root / "needs_batching" / "config.pbtxt").write_text(ADVICE_CONFIG)
    (root / "mlp_pref6" / "1").mkdir(parents=True)
    shutil.copy(example_repo / "mlp_onnx" / "1" / "model.onnx", root / "mlp_pref6" / "1" / "model.onnx")
    (root / "mlp_pref6" / "config.pbtxt").write_text(ONNX_CONFIG)
    (root / "fanout" / "1").mkdir(parents=True)
    (root / "fanout" / "config.pbtxt").write_text(FANOUT_CONFIG)
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory, example_repo) -> Path:
    return build_repo(tmp_path_factory.mktemp("batching") / "models", example_repo)


@pytest.fixture(scope="module")
def srv(repo):
    with serving(TritondServer(repo)) as s:
        yield s


@pytest.fixture
def gates(tmp_path):
    g = Gates(tmp_path)
    yield g
    g.open("gate")                                       # never leave an instance held


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(max_workers=16) as ex:
        yield ex


class Gates:
    """Files the model waits for (gate) or creates (started)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str) -> str:
        return str(self.root / name)

    def open(self, name: str) -> None:
        Path(self.path(name)).touch()

    def wait(self, name: str) -> None:
        wait_for(lambda: Path(self.path(name)).exists(), WAIT_S, f"file {name}", every=0.01)


def rows(n: int, width: int = 4, value: float = 0.0) -> np.ndarray:
    return np.full((n, width), value, dtype=np.float32)


def infer(srv, model: str, x: np.ndarray, **kw):
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120.0)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp], **kw)
    finally:
        client.close()


def submit(pool, srv, model: str, x: np.ndarray, **kw) -> Future:
    return pool.submit(infer, srv, model, x, **kw)


def wait_pending(srv, model: str, n: int) -> None:
    wait_for(lambda: metric(srv, "nv_inference_pending_request_count", 0, model=model, version="1") == n, WAIT_S,
             f"{n} requests pending on {model}", every=0.01)


def stats(srv, model: str) -> dict:
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        [s] = client.get_inference_statistics(model)["model_stats"]
        return s
    finally:
        client.close()


def occupy(pool, srv, gates, model: str, n: int = 1, gate: str = "gate") -> Future:
    """Start a request of batch size n that holds the model's instance until `gate` opens."""
    fut = submit(pool, srv, model, rows(n), parameters={"gate": gates.path(gate), "started": gates.path(gate + ".started")})
    gates.wait(gate + ".started")
    return fut


def queue_in_order(pool, srv, model: str, xs: list[np.ndarray], base: int = 0, **kw) -> list[Future]:
    """Queue requests one after another, each admitted before the next is sent."""
    futs = []
    for i, x in enumerate(xs):
        futs.append(submit(pool, srv, model, x, **kw))
        wait_pending(srv, model, base + i + 1)
    return futs


def batch_size(result) -> int:
    return int(result.as_numpy("BATCH_SIZE")[0, 0])


def start_ns(result) -> int:
    return int(result.as_numpy("START_NS")[0, 0])


# ------------------------------------------------------------------ batch formation


def test_queued_requests_form_one_batch_when_the_instance_frees(srv, gates, pool):
    before = stats(srv, "gated")
    blocker = occupy(pool, srv, gates, "gated", n=8)       # 8 = preferred size: runs at once
    futs = [submit(pool, srv, "gated", rows(1, value=i)) for i in range(5)]
    wait_pending(srv, "gated", 5)
    gates.open("gate")
    assert batch_size(blocker.result(WAIT_S)) == 1
    results = [f.result(WAIT_S) for f in futs]
    assert [batch_size(r) for r in results] == [5] * 5
    assert [int(r.as_numpy("BATCH_ELEMENTS")[0, 0]) for r in results] == [5] * 5
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), rows(1, value=i))
    after = stats(srv, "gated")
    assert after["inference_count"] - before["inference_count"] == 13
    assert after["execution_count"] - before["execution_count"] == 2
    st, st0 = after["inference_stats"], before["inference_stats"]
    for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert st[name]["count"] - st0[name]["count"] == 6, name
    assert st["fail"]["count"] == st0["fail"]["count"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    sizes0 = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert sizes.get(8, 0) - sizes0.get(8, 0) == 1
    assert sizes.get(5, 0) - sizes0.get(5, 0) == 1
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0


def test_requests_admitted_together_to_a_free_instance_run_as_one_batch(srv):
    """The ensemble's two steps reach `turn` in one broker turn while its instance is free:
    one execution of both, not the first alone and the second after it."""
    before = stats(srv, "turn")
    result = infer(srv, "fanout", rows(1, value=3))
    assert (int(result.as_numpy("SIZE_A")[0, 0]), int(result.as_numpy("SIZE_B")[0, 0])) == (2, 2)
    np.testing.assert_array_equal(result.as_numpy("A"), rows(1, value=3))
    np.testing.assert_array_equal(result.as_numpy("B"), rows(1, value=3))
    after = stats(srv, "turn")
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["execution_count"] - before["execution_count"] == 1


def test_short_queue_waits_out_the_delay(srv):
    before = stats(srv, "gated")
    result = infer(srv, "gated", rows(2))
    after = stats(srv, "gated")
    assert (batch_size(result), int(result.as_numpy("BATCH_ELEMENTS")[0, 0])) == (1, 2)
    queued = after["inference_stats"]["queue"]["ns"] - before["inference_stats"]["queue"]["ns"]
    assert queued >= 1_000_000_000                           # max_queue_delay_microseconds: 1 s
    assert after["inference_count"] - before["inference_count"] == 2


def test_preferred_batch_sizes_are_honored(srv, gates, pool):
    blocker = occupy(pool, srv, gates, "pref", n=4)         # 4 = preferred: runs at once
    futs = queue_in_order(pool, srv, "pref", [rows(1, value=i) for i in range(5)])
    gates.open("gate")
    blocker.result(WAIT_S)
    first = [f.result(WAIT_S) for f in futs[:4]]
    assert [batch_size(r) for r in first] == [4] * 4
    wait_pending(srv, "pref", 1)                           # the fifth waits for a partner or the delay
    assert not futs[4].done()
    last = infer(srv, "pref", rows(1, value=9))
    assert batch_size(last) == 2 and batch_size(futs[4].result(WAIT_S)) == 2
    np.testing.assert_array_equal(futs[4].result().as_numpy("OUTPUT0"), rows(1, value=4))


def test_shape_incompatible_requests_are_not_mixed(srv, gates, pool):
    blocker = occupy(pool, srv, gates, "shapes")
    widths = [2, 2, 3, 2, 3]
    futs = queue_in_order(pool, srv, "shapes", [rows(1, w, value=i) for i, w in enumerate(widths)])
    gates.open("gate")
    blocker.result(WAIT_S)
    results = [f.result(WAIT_S) for f in futs]
    assert [batch_size(r) for r in results] == [2, 2, 1, 1, 1]
    starts = [start_ns(r) for r in results]
    assert starts[0] == starts[1] < starts[2] < starts[3] < starts[4]
    for i, (w, r) in enumerate(zip(widths, results)):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), rows(1, w, value=i))


def test_requests_with_their_own_batch_dimension(srv, gates, pool):
    blocker = occupy(pool, srv, gates, "shapes")
    futs = queue_in_order(pool, srv, "shapes", [rows(n, 3, value=n) for n in (3, 4, 2)])
    gates.open("gate")
    blocker.result(WAIT_S)
    results = [f.result(WAIT_S) for f in futs]
    # 3 + 4 fit in 8; 2 more would not.
    assert [int(r.as_numpy("BATCH_ELEMENTS")[0, 0]) for r in results] == [7, 7, 2]
    for n, r in zip((3, 4, 2), results):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), rows(n, 3, value=n))
        assert r.as_numpy("BATCH_SIZE").shape == (n, 1)


def test_without_dynamic_batching_each_request_runs_alone(srv, gates, pool):
    before = stats(srv, "nobatch")
    blocker = occupy(pool, srv, gates, "nobatch")
    futs = queue_in_order(pool, srv, "nobatch", [rows(2) for _ in range(3)])
    gates.open("gate")
    blocker.result(WAIT_S)
    assert [batch_size(f.result(WAIT_S)) for f in futs] == [1, 1, 1]
    after = stats(srv, "nobatch")
    assert after["execution_count"] - before["execution_count"] == 4
    assert after["inference_count"] - before["inference_count"] == 7


def test_without_dynamic_batching_quick_requests_queued_together_still_run_alone(srv, pool):
    """Requests that queue behind a busy instance may reach its worker in one message (a serial
    run); the model still sees each alone and each answer is its own."""
    before = stats(srv, "nobatch")
    futs = [submit(pool, srv, "nobatch", rows(1, value=float(i))) for i in range(160)]
    results = [f.result(WAIT_S) for f in futs]
    assert [batch_size(r) for r in results] == [1] * 160
    assert [float(r.as_numpy("OUTPUT0")[0, 0]) for r in results] == [float(i) for i in range(160)]
    after = stats(srv, "nobatch")
    assert after["execution_count"] - before["execution_count"] == 160
    assert after["inference_count"] - before["inference_count"] == 160


def test_requests_slower_than_a_flush_are_answered_one_by_one_through_runs_sent_ahead(srv, pool):
    """Requests a little slower than the worker's flush bound, queued behind a busy instance:
    each run's results come back as they finish and the next run reaches the worker before the
    current one ends; every answer is still its own request's, each executed alone and counted."""
    slow = {"sleep_ms": 0.8}
    for _ in range(3):                  # the broker learns how long a request takes
        infer(srv, "nobatch", rows(1), parameters=slow)
    before = stats(srv, "nobatch")
    futs = [submit(pool, srv, "nobatch", rows(1, value=float(i)), parameters=slow) for i in range(16)]
    results = [f.result(WAIT_S) for f in futs]
    assert [float(r.as_numpy("OUTPUT0")[0, 0]) for r in results] == [float(i) for i in range(16)]
    assert [batch_size(r) for r in results] == [1] * 16
    assert len({start_ns(r) for r in results}) == 16
    after = stats(srv, "nobatch")
    for key in ("execution_count", "inference_count"):
        assert after[key] - before[key] == 16
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 16


def test_onnx_batch_of_requests_with_their_own_batch_dims(srv, repo, pool):
    import onnxruntime as ort
    session = ort.InferenceSession(str(repo / "mlp_pref6" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, 256)).astype(np.float32) for n in (1, 2, 3)]
    before = stats(srv, "mlp_pref6")
    futs = [submit(pool, srv, "mlp_pref6", x) for x in xs]  # 1+2+3 = preferred 6: one execution
    for x, f in zip(xs, futs):
        np.testing.assert_allclose(f.result(WAIT_S).as_numpy("OUTPUT0"), session.run(None, {"INPUT0": x})[0],
                                   rtol=1e-4, atol=1e-4)
    after = stats(srv, "mlp_pref6")
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 6
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in after["batch_stats"]] == [(6, 1)]


# ------------------------------------------------------------------ priority and queue policy


def test_higher_priority_is_served_first(srv, gates, pool):
    blocker = occupy(pool, srv, gates, "policy")
    low = queue_in_order(pool, srv, "policy", [rows(1, value=v) for v in (1, 2)])
    high = queue_in_order(pool, srv, "policy", [rows(1, value=v) for v in (3, 4)], base=2, priority=1)
    gates.open("gate")
    blocker.result(WAIT_S)
    order = sorted((start_ns(f.result(WAIT_S)), float(f.result().as_numpy("OUTPUT0")[0, 0])) for f in low + high)
    assert [v for _, v in order] == [3.0, 4.0, 1.0, 2.0]


def test_max_queue_size_rejects_at_once(srv, gates, pool):
    before = stats(srv, "policy")
    blocker = occupy(pool, srv, gates, "policy")
    queued = queue_in_order(pool, srv, "policy", [rows(1), rows(1)])
    with pytest.raises(InferenceServerException) as e:
        infer(srv, "policy", rows(1), request_id="over")
    assert e.value.status() == "503"
    assert e.value.message() == "[request id: over] Exceeds maximum queue size"
    with pytest.raises(InferenceServerException) as e:
        infer(srv, "policy", rows(1))
    assert e.value.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
    infer_high = submit(pool, srv, "policy", rows(1), priority=1)   # another level, another queue
    wait_pending(srv, "policy", 3)
    gates.open("gate")
    for f in [blocker, infer_high, *queued]:
        f.result(WAIT_S)
    after = stats(srv, "policy")
    # Triton counts a request refused at admission nowhere.
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]


def test_reject_timeout_fails_the_request(srv, gates, pool):
    before = stats(srv, "policy")
    blocker = occupy(pool, srv, gates, "policy")
    patient = queue_in_order(pool, srv, "policy", [rows(1)])[0]
    hasty = submit(pool, srv, "policy", rows(1), timeout=200_000)   # µs; shorter than the default
    with pytest.raises(InferenceServerException) as e:
        hasty.result(WAIT_S)
    assert e.value.status() == "503"
    assert e.value.message() == "Request timeout expired"
    assert not patient.done()
    gates.open("gate")
    blocker.result(WAIT_S)
    patient.result(WAIT_S)
    after = stats(srv, "policy")
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert after["inference_count"] - before["inference_count"] == 2


def test_delay_timeout_moves_the_request_behind_later_ones(srv, gates, pool):
    blocker = occupy(pool, srv, gates, "policy")
    late = queue_in_order(pool, srv, "policy", [rows(1, value=1)], priority=1, timeout=100_000)[0]
    time.sleep(0.3)                                      # past its 0.1 s timeout: now DELAYed
    later = queue_in_order(pool, srv, "policy", [rows(1, value=2)], base=1, priority=1)[0]
    gates.open("gate")
    blocker.result(WAIT_S)
    assert start_ns(later.result(WAIT_S)) < start_ns(late.result(WAIT_S))


# ------------------------------------------------------------------ instances and ordering


def test_two_instances_execute_in_parallel(srv, gates, pool):
    futs = []
    for i in range(2):      # one at a time: requests arriving together would leave as one batch
        futs.append(submit(pool, srv, "unordered", rows(1), parameters={"gate": gates.path("gate"),
                                                                         "started": gates.path(f"s{i}")}))
        gates.wait(f"s{i}")                              # both running before either may finish
    gates.open("gate")
    a, b = (f.result(WAIT_S) for f in futs)
    assert batch_size(a) == batch_size(b) == 1
    assert max(start_ns(a), start_ns(b)) < min(int(a.as_numpy("END_NS")[0, 0]), int(b.as_numpy("END_NS")[0, 0]))


def _second_finishes_first(srv, gates, pool, model: str):
    first = occupy(pool, srv, gates, model)
    before = stats(srv, model)["execution_count"]
    second = submit(pool, srv, model, rows(1))
    wait_for(lambda: stats(srv, model)["execution_count"] == before + 1, WAIT_S, "the second request to execute",
             every=0.01)
    return first, second


def test_without_preserve_ordering_a_later_request_may_answer_first(srv, gates, pool):
    first, second = _second_finishes_first(srv, gates, pool, "unordered")
    second.result(WAIT_S)
    assert not first.done()
    gates.open("gate")
    first.result(WAIT_S)


def test_preserve_ordering_holds_later_responses(srv, gates, pool):
    first, second = _second_finishes_first(srv, gates, pool, "ordered")
    time.sleep(0.5)                                      # time for an early answer to arrive
    assert not second.done()                             # executed, but answered only after the first
    gates.open("gate")
    first.result(WAIT_S)
    second.result(WAIT_S)


# ------------------------------------------------------------------ statistics


def test_failed_request_counts_as_failure_only(srv, gates, pool):
    before = stats(srv, "gated")
    blocker = occupy(pool, srv, gates, "gated", n=8)
    ok = submit(pool, srv, "gated", rows(3))
    bad = submit(pool, srv, "gated", rows(2), parameters={"fail": True})
    wait_pending(srv, "gated", 2)
    gates.open("gate")
    blocker.result(WAIT_S)
    assert batch_size(ok.result(WAIT_S)) == 2
    with pytest.raises(InferenceServerException, match="asked to fail"):
        bad.result(WAIT_S)
    after = stats(srv, "gated")
    st, st0 = after["inference_stats"], before["inference_stats"]
    assert st["success"]["count"] - st0["success"]["count"] == 2
    assert st["fail"]["count"] - st0["fail"]["count"] == 1
    assert st["queue"]["count"] - st0["queue"]["count"] == 2
    assert after["inference_count"] - before["inference_count"] == 8 + 3
    assert after["execution_count"] - before["execution_count"] == 2
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    sizes0 = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert sizes.get(5, 0) - sizes0.get(5, 0) == 1          # the execution had 3 + 2 elements


def test_grpc_queue_full_and_statistics(srv, gates, pool):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    blocker = occupy(pool, srv, gates, "policy")
    queued = queue_in_order(pool, srv, "policy", [rows(1), rows(1)])
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(rows(1))
    with pytest.raises(InferenceServerException) as e:
        client.infer("policy", [inp], request_id="g1")
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "[request id: g1] Exceeds maximum queue size"
    gates.open("gate")
    for f in [blocker, *queued]:
        f.result(WAIT_S)
    as_json = stats(srv, "policy")
    [proto] = client.get_inference_statistics("policy", "1").model_stats
    client.close()
    assert (proto.inference_count, proto.execution_count) == (as_json["inference_count"], as_json["execution_count"])
    assert proto.inference_stats.success.count == as_json["inference_stats"]["success"]["count"]
    assert proto.inference_stats.fail.count == as_json["inference_stats"]["fail"]["count"]
    assert [(b.batch_size, b.compute_infer.count) for b in proto.batch_stats] == [
        (b["batch_size"], b["compute_infer"]["count"]) for b in as_json["batch_stats"]]


# ------------------------------------------------------------------ config advice


def test_config_advice_in_log_and_check(srv, repo):
    assert ADVICE in srv.log
    out = subprocess.run([sys.executable, "-m", "tritond.cli", "check", str(repo)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert f"  advice: {ADVICE}" in out.stdout.splitlines(), out.stdout + out.stderr
    assert "nobatch': max_batch_size is 8 but there is no dynamic_batching" in out.stdout
