"""An ensemble's `max_inflight_requests` through the gRPC stream: a decoupled step's responses
each run the slow step below it, and at most the limit of that step's requests execute at once
across every request of the ensemble (the slow model has four instances, so without the limit
more would). Every response still arrives, in full; a request cancelled while its responses
wait at the gate gives its turns back, so the next request completes."""
from __future__ import annotations

import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import TritondServer, serving
from stream_models import STREAM_MODEL

CONSUMER = Path(__file__).resolve().parents[1] / "fixtures" / "peak_consumer.py"
ENSEMBLE = '''name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "PEAK" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {limit}
  step [
    {{ model_name: "producer" model_version: -1 input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "made" }} }},
    {{ model_name: "consumer_{name}" model_version: -1 input_map {{ key: "X" value: "made" }}
       output_map [ {{ key: "Y" value: "Y" }}, {{ key: "PEAK" value: "PEAK" }} ] }}
  ]
}}
'''
CONSUMER_CONFIG = '''name: "consumer_{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "PEAK" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 4 kind: KIND_CPU }} ]
parameters [ {{ key: "markers" value: {{ string_value: "{markers}" }} }} ]
'''
LIMITS = {"limit_1": 1, "limit_2": 2, "open": 0}


def repository(root: Path) -> Path:
    repo = root / "models"
    (repo / "producer" / "1").mkdir(parents=True)
    shutil.copyfile(STREAM_MODEL, repo / "producer" / "1" / "model.py")
    (repo / "producer" / "config.pbtxt").write_text('''name: "producer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
''')
    for name, limit in LIMITS.items():
        markers = root / f"markers_{name}"
        markers.mkdir()
        (repo / f"consumer_{name}" / "1").mkdir(parents=True)
        shutil.copyfile(CONSUMER, repo / f"consumer_{name}" / "1" / "model.py")
        (repo / f"consumer_{name}" / "config.pbtxt").write_text(CONSUMER_CONFIG.format(name=name, markers=markers))
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            ENSEMBLE.format(name=name, limit=f"max_inflight_requests: {limit}" if limit else ""))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(TritondServer(repository(tmp_path_factory.mktemp("backpressure")))) as s:
        yield s


def streams(url: str, model: str, requests: dict[str, int], timeout: float = 60.0) -> dict[str, list[tuple[int, int]]]:
    """Each request id's (Y, PEAK) responses, one stream per request, all sent at once."""
    clients, results = [], queue.Queue()
    try:
        for rid, count in requests.items():
            c = grpcclient.InferenceServerClient(url)
            c.start_stream(callback=lambda result, error, rid=rid: results.put((rid, result, error)))
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([100], np.int32))
            c.async_stream_infer(model, [inp], request_id=rid, parameters={"count": count})
            clients.append(c)
        got: dict[str, list[tuple[int, int]]] = {rid: [] for rid in requests}
        finished: set[str] = set()
        deadline = time.monotonic() + timeout
        while len(finished) < len(requests):
            rid, result, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, (rid, error)
            response = result.get_response()
            if response.outputs:
                got[rid].append((int(result.as_numpy("Y")[0]), int(result.as_numpy("PEAK")[0])))
            if response.parameters["triton_final_response"].bool_param:
                finished.add(rid)
        return got
    finally:
        for c in clients:
            c.stop_stream()
            c.close()


def test_the_config_is_logged_as_triton_logs_it(server):
    assert "Ensemble model 'limit_1' configured with max_inflight_requests: 1" in server.log
    assert "Ensemble model 'limit_2' configured with max_inflight_requests: 2" in server.log


@pytest.mark.parametrize("name", ["limit_1", "limit_2"])
def test_at_most_the_limit_of_a_steps_requests_execute_at_once(server, name):
    got = streams(server.grpc_url, name, {f"r{i}": 6 for i in range(4)})
    for rid, responses in got.items():
        assert sorted(y for y, _ in responses) == [100 + i for i in range(6)], (rid, responses)
    peaks = [peak for responses in got.values() for _, peak in responses]
    assert max(peaks) <= LIMITS[name], peaks


def test_without_the_limit_every_response_arrives_too(server):
    got = streams(server.grpc_url, "open", {f"r{i}": 6 for i in range(4)})
    assert all(sorted(y for y, _ in r) == [100 + i for i in range(6)] for r in got.values()), got


def test_a_request_cancelled_under_backpressure_gives_its_turns_back(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], np.int32))
    c.async_stream_infer("limit_1", [inp], request_id="long", parameters={"count": 40})
    result, error = results.get(timeout=30)
    assert error is None and result.get_response().outputs
    c.stop_stream(cancel_requests=True)
    c.close()
    # the cancelled request's waiting responses left the gate: a new request is served in full
    got = streams(server.grpc_url, "limit_1", {"after": 3})
    assert sorted(y for y, _ in got["after"]) == [100, 101, 102]
    assert server.proc.poll() is None
