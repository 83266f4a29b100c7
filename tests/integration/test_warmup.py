"""Model warmup (`model_warmup`) through tritonclient: every data kind reaches the model before it
is READY, warmup is not counted in the statistics, a failing sample fails the load with its
name, and a worker restarted after a crash warms up before it serves."""
from __future__ import annotations

import json
import os
import re
import signal
import struct
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, http_get, serving, wait_for
from fault_models import add_fault_model
from lifecycle_util import infer, model_ready

SAMPLES = """model_warmup [
  { name: "zeros" batch_size: 2 count: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } },
  { name: "noise" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } },
  { name: "recorded" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "sample.bin" } } }
]"""


def sample(name: str, dims: str = "2") -> str:
    return (f'model_warmup [{{ name: "{name}" batch_size: 1 inputs {{ key: "INPUT0" value: '
            f'{{ data_type: TYPE_FP32 dims: [ {dims} ] zero_data: true }} }} }}]')


@pytest.fixture(scope="module")
def markers(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("warm-markers")


@pytest.fixture(scope="module")
def server(tmp_path_factory, markers):
    repo = tmp_path_factory.mktemp("warmup") / "models"
    add_fault_model(repo, "warm", pid_outputs=True, params={"marker_dir": markers}, extra=SAMPLES)
    (repo / "warm" / "warmup").mkdir()
    (repo / "warm" / "warmup" / "sample.bin").write_bytes(struct.pack("<2f", 1.5, 2.5))
    add_fault_model(repo, "refuses", params={"mode": "fail_warmup"}, extra=sample("first_contact"))
    add_fault_model(repo, "vague", extra=sample("open_ended", "-1"))
    add_fault_model(repo, "falsy", pid_outputs=True, params={"marker_dir": markers},
                    extra=sample("unset", "2").replace("zero_data: true", "zero_data: false"))
    with serving(TritondServer(repo, ["--model-control-mode=explicit", "--load-model=warm", "--log-verbose=1"])) as s:
        yield s


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield c
    c.close()


def warmups(markers: Path, pid: int) -> list[dict]:
    path = markers / f"warmup-{pid}"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_sample_runs_before_the_model_is_ready_and_is_not_counted(server, client, markers):
    (pid,) = server.worker_pids("warm")
    seen = warmups(markers, pid)
    ids = [w["id"] for w in seen]
    assert ids == ["warmup:zeros"] * 4 + ["warmup:noise", "warmup:recorded"]
    assert all(w["shape"] == [1, 2] and w["dtype"] == "float32" for w in seen)
    assert seen[0]["values"] == [0.0, 0.0] and seen[-1]["values"] == [1.5, 2.5]
    assert seen[4]["values"] != [0.0, 0.0]
    stats = client.get_inference_statistics("warm")["model_stats"][0]
    assert (stats["execution_count"], stats["inference_count"]) == (0, 0)
    infer(client, "warm")
    stats = client.get_inference_statistics("warm")["model_stats"][0]
    assert (stats["execution_count"], stats["inference_count"]) == (1, 1)
    status, body = http_get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    (line,) = [ln for ln in body.decode().splitlines() if ln.startswith('nv_model_load_duration_secs{model="warm"')]
    assert status == 200 and float(line.split()[-1]) > 0
    assert "loaded model 'warm' version 1 in " in server.log
    # Triton's verbose line per iteration (L0_warmup greps for it)
    assert re.search(r"model 'warm' instance \S+ is running warmup sample 'zeros' for iteration 2", server.log)


def test_a_failing_sample_fails_the_load_with_its_name(client):
    with pytest.raises(InferenceServerException) as e:
        client.load_model("refuses")
    assert e.value.status() == "400"
    message = e.value.message()     # the model's exception as Triton's stub words it: type, text, frames
    assert "failed to run warmup sample 'first_contact': " in message
    assert message.rstrip().endswith(";")      # Triton's form: each request's error followed by '; '
    assert "this model refuses its warmup input\n\nAt:\n" in message and "model.py(" in message
    with pytest.raises(InferenceServerException) as e:
        client.load_model("vague")
    assert ("warmup sample 'open_ended': warmup setting expects all variable-size dimensions are specified "
            "for input 'INPUT0'") in e.value.message()
    assert not client.is_model_ready("refuses") and not client.is_model_ready("vague")


def test_zero_data_false_still_sends_zeros_as_in_triton(server, client, markers):
    """zero_data/random_data/input_data_file are a oneof: `zero_data: false` picks zeros (a sample of
    L0_backend_python's bls_model_loading)."""
    client.load_model("falsy")
    (pid,) = server.worker_pids("falsy")
    assert [w["values"] for w in warmups(markers, pid)] == [[0.0, 0.0]]
    client.unload_model("falsy")


def test_a_restarted_worker_warms_up_before_it_serves(server, client, markers):
    (old,) = server.worker_pids("warm")
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: server.worker_pids("warm") not in ([], [old]) and model_ready(server, "warm"),
             what="the replacement worker")
    (new,) = server.worker_pids("warm")
    assert len(warmups(markers, new)) == 6
    assert int(infer(client, "warm").as_numpy("PID")[0][0]) == new
