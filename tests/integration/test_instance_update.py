"""A load that changes only a model's instance groups updates its instances in place, as Triton
does: the instances whose settings stay keep running (initialize is not called again), new
ones start, removed ones finish their work and finalize, requests in flight meanwhile all
succeed; renaming or regrouping instances changes nothing; any other change reloads."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import TritondServer, serving, wait_for

MODEL = '''
import json, os
import triton_python_backend_utils as pb_utils


def note(what):
    with open(os.environ["INSTANCE_LOG"], "a") as f:
        f.write(what + "\\n")


class TritonPythonModel:
    def initialize(self, args):
        note("initialize")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]

    def finalize(self):
        note("finalize")
'''


def config(groups: str, batch: int = 0, extra: str = "") -> str:
    return (f'name: "resized"\nbackend: "python"\nmax_batch_size: {batch}\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f"instance_group [ {groups} ]\n{extra}")


def cpu(count: int, name: str = "") -> str:
    return "{ " + (f'name: "{name}" ' if name else "") + f"count: {count} kind: KIND_CPU }}"


class Counts:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> tuple[int, int]:
        lines = self.path.read_text().split() if self.path.exists() else []
        return lines.count("initialize"), lines.count("finalize")


@pytest.fixture
def setup(tmp_path):
    repo = tmp_path / "models"
    (repo / "resized" / "1").mkdir(parents=True)
    (repo / "resized" / "1" / "model.py").write_text(MODEL)
    (repo / "resized" / "config.pbtxt").write_text(config(cpu(2)))
    log = tmp_path / "instances.log"
    server = TritondServer(repo, ["--model-control-mode=explicit", "--load-model=resized"],
                           env={"INSTANCE_LOG": str(log)})
    with serving(server) as s:
        yield s, repo, Counts(log)


def infer(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [3], "FP32")
    inp.set_data_from_numpy(np.ones(3, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("resized", [inp]).as_numpy("OUTPUT0"), np.ones(3))


def test_instances_added_and_removed_in_place_under_traffic(setup):
    s, repo, counts = setup
    client = grpcclient.InferenceServerClient(s.grpc_url)
    assert counts() == (2, 0)
    stop = threading.Event()
    errors: list[Exception] = []

    def traffic() -> None:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        while not stop.is_set():
            try:
                infer(c)
            except Exception as e:      # every request must succeed through the updates
                errors.append(e)
    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for count, expected in ((3, (3, 0)), (1, (3, 2)), (4, (6, 2))):
            (repo / "resized" / "config.pbtxt").write_text(config(cpu(count)))
            client.load_model("resized")
            assert counts() == expected, count       # answered once the new serve and the removed stopped
            assert len(client.get_model_config("resized").config.instance_group) == 1
            assert client.get_model_config("resized").config.instance_group[0].count == count
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    assert len(s.worker_pids("resized")) == 4
    client.unload_model("resized")
    wait_for(lambda: counts() == (6, 6), 30, "every instance to finalize after the unload")


def test_renamed_or_regrouped_instances_are_the_same_instances(setup):
    s, repo, counts = setup
    client = grpcclient.InferenceServerClient(s.grpc_url)
    workers = sorted(s.worker_pids("resized"))
    for groups in (f"{cpu(1, 'a')}, {cpu(1, 'b')}", cpu(2, "together")):
        (repo / "resized" / "config.pbtxt").write_text(config(groups))
        client.load_model("resized")
        assert counts() == (2, 0)
        assert sorted(s.worker_pids("resized")) == workers
        infer(client)


def test_the_load_api_config_resizes_too_and_other_changes_reload(setup):
    s, repo, counts = setup
    client = grpcclient.InferenceServerClient(s.grpc_url)
    current = client.get_model_config("resized", as_json=True)["config"]
    current["instance_group"][0]["count"] = 3
    client.load_model("resized", config=json.dumps(current))
    assert counts() == (3, 0)
    infer(client)
    (repo / "resized" / "config.pbtxt").write_text(config(cpu(2), batch=4))     # not only instances
    client.load_model("resized")
    assert counts()[0] == 5
    infer_batched = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    infer_batched.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    client.infer("resized", [infer_batched])


SEQUENCES = "sequence_batching { direct { } max_sequence_idle_microseconds: 60000000 }\n"


def test_a_removed_instance_runs_its_sequences_to_their_end(setup):
    s, repo, counts = setup
    client = grpcclient.InferenceServerClient(s.grpc_url)
    (repo / "resized" / "config.pbtxt").write_text(config(cpu(2), batch=2, extra=SEQUENCES))
    client.load_model("resized")                    # not only instances: a reload
    wait_for(lambda: counts() == (4, 2), 30, "the replaced version's instances to finalize")

    def step(seq: int, start: bool = False, end: bool = False) -> None:
        inp = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        inp.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
        client.infer("resized", [inp], sequence_id=seq, sequence_start=start, sequence_end=end)
    step(1, start=True)
    step(2, start=True)         # each sequence holds a slot of its own instance
    (repo / "resized" / "config.pbtxt").write_text(config(cpu(1), batch=2, extra=SEQUENCES))
    client.load_model("resized")
    assert counts() == (4, 2)                       # the removed instance still runs sequence 2
    step(2)
    step(1)
    step(2, end=True)
    wait_for(lambda: counts() == (4, 3), 30, "the removed instance to finalize once its sequence ended")
    step(3, start=True, end=True)
    step(1, end=True)
    assert counts() == (4, 3)
    wait_for(lambda: len(s.worker_pids("resized")) == 1, 30, "the stopped workers to exit")

