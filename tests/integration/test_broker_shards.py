"""--broker-shards: several brokers, each scheduling its own group of models, behind one server.

Through the real clients: every model is served by the broker its group hashes to (its
workers are that broker's children), an ensemble sits with the models it composes, a BLS call
reaches a model of the other broker, the repository index, statistics and metrics cover
every model, a client shared-memory region registered once serves models of both brokers,
explicit loads and unloads reach the model's broker, and a broker killed is restarted (the
other keeps serving meanwhile; the region is known to the new one) with nothing left behind.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, http_get, metric, serving, wait_for
from fault_models import add_fault_model
from tritond.repository.ensemble import ensemble_dependencies
from tritond.repository.layout import scan
from tritond.repository.partition import partition, shard_of

SHARDS = ["--broker-shards", "2"]


def owners(repo: Path) -> dict[str, int]:
    return partition({n: ensemble_dependencies(s.path) or [] for n, s in scan([str(repo)]).items()}, 2)


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def brokers(s: TritondServer) -> list[int]:
    """The brokers' pids, the first broker first (the others are its children)."""
    pids = s.role_pids("tritond.broker.main")
    return sorted(pids, key=lambda p: parent(p) in pids)


def identity(url: str, model: str = "identity_fp32") -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [3], "FP32")
    inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
    try:
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


@pytest.fixture(scope="module")
def sharded(example_repo):
    with serving(TritondServer(example_repo, SHARDS + ["--allow-client-shm=true"])) as s:
        yield s


def test_each_broker_schedules_its_own_group(sharded, example_repo):
    split = owners(example_repo)
    assert set(split.values()) == {0, 1}, split
    for step in ensemble_dependencies(str(example_repo / "search_pipeline_ensemble")):
        assert split[step] == split["search_pipeline_ensemble"]
    first, second = brokers(sharded)
    assert parent(second) == first
    for model in ("identity_fp32", "add_sub_onnx", "bls_router", "mlp_onnx"):
        [worker] = sharded.worker_pids(model)[:1]
        assert parent(worker) == (first, second)[split[model]], model
    index = httpclient.InferenceServerClient(sharded.http_url).get_model_repository_index()
    assert sorted(m["name"] for m in index) == sorted(split)
    assert all(m["state"] == "READY" for m in index)


def test_requests_reach_every_broker(sharded, example_repo):
    np.testing.assert_array_equal(identity(sharded.http_url), [1, 2, 3])
    client = grpcclient.InferenceServerClient(sharded.grpc_url)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("add_sub_onnx", inputs).as_numpy("OUTPUT0"), 2 * x)
    stats = {m.name for m in client.get_inference_statistics().model_stats}
    assert stats == set(owners(example_repo))
    assert client.get_inference_statistics("identity_fp32").model_stats[0].inference_count >= 1
    assert metric(sharded, "nv_inference_count", model="identity_fp32", version="1") >= 1


def test_bls_call_to_a_model_of_the_other_broker(sharded, example_repo):
    split = owners(example_repo)
    assert split["bls_router"] != split["identity_fp32"] or split["bls_router"] != split["add_sub_onnx"]
    client = httpclient.InferenceServerClient(sharded.http_url)
    x = np.arange(16, dtype=np.float32)
    for route, factor in (("identity", 1), ("add_sub", 2)):
        inp = httpclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("bls_router", [inp], parameters={"route": route})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), factor * x)


def test_one_registration_serves_both_brokers(sharded):
    key = f"/shards_{os.getpid()}"
    handle = shm.create_shared_memory_region("shards_in", key, 64)
    client = httpclient.InferenceServerClient(sharded.http_url)
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
        client.register_system_shared_memory("shards_in", key, 64)
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["shards_in"]
        inp = httpclient.InferInput("INPUT0", [3], "FP32")
        inp.set_shared_memory("shards_in", 12)
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), [0, 1, 2])
        inp = httpclient.InferInput("INPUT0", [16], "FP32")
        inp.set_shared_memory("shards_in", 64)
        np.testing.assert_array_equal(client.infer("bls_router", [inp], parameters={"route": "identity"})
                                      .as_numpy("OUTPUT0"), np.arange(16))
    finally:
        client.unregister_system_shared_memory("shards_in")
        shm.destroy_shared_memory_region(handle)
    assert client.get_system_shared_memory_status() == []


def _names_on_both(count: int = 2) -> list[str]:
    """Model names, `count` for each of the two brokers."""
    names: dict[int, list[str]] = {0: [], 1: []}
    n = 0
    while any(len(v) < count for v in names.values()):
        name = f"m{n}"
        if len(names[shard_of(name, 2)]) < count:
            names[shard_of(name, 2)].append(name)
        n += 1
    return names[0] + names[1]


def test_explicit_loads_reach_the_models_broker(tmp_path):
    repo = tmp_path / "models"
    names = _names_on_both()
    for name in names:
        add_fault_model(repo, name)
    args = SHARDS + ["--model-control-mode", "explicit", "--load-model", names[0]]
    with serving(TritondServer(repo, args)) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.is_model_ready(names[0]) and not client.is_model_ready(names[-1])
        for name in names[1:]:
            client.load_model(name)
        first, second = brokers(s)
        for name in names:
            assert client.is_model_ready(name)
            [worker] = s.worker_pids(name)
            assert parent(worker) == (first, second)[shard_of(name, 2)]
        client.unload_model(names[-1])
        wait_for(lambda: not s.worker_pids(names[-1]), 30, "the unloaded model's worker to exit")
        assert not client.is_model_ready(names[-1])
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            client.load_model("no_such_model")
        index = {m["name"]: m.get("state", "") for m in client.get_model_repository_index()}
        assert index == {**{n: "READY" for n in names[:-1]}, names[-1]: "UNAVAILABLE"}


def test_a_broker_killed_is_restarted_while_the_other_serves(tmp_path):
    repo = tmp_path / "models"
    names = _names_on_both(1)
    for name in names:
        add_fault_model(repo, name)
    key = f"/shards_kill_{os.getpid()}"
    handle = shm.create_shared_memory_region("kill_in", key, 12)
    try:
        shm.set_shared_memory_region(handle, [np.ones((1, 3), dtype=np.float32)])
        with serving(TritondServer(repo, SHARDS + ["--allow-client-shm=true"])) as s:
            client = httpclient.InferenceServerClient(s.http_url)
            client.register_system_shared_memory("kill_in", key, 12)
            first, second = brokers(s)
            [lost_worker] = s.worker_pids(names[1])
            os.kill(second, signal.SIGKILL)

            def fails() -> bool:
                try:
                    call(client, names[1])
                    return False
                except InferenceServerException as e:
                    assert e.status() == "503", e
                    return True
            wait_for(fails, 15, "requests to the dead broker's model to fail with 503")
            np.testing.assert_array_equal(call(client, names[0]), np.ones((1, 3)))   # the other serves on
            wait_for(lambda: _serves(client, names[1]), 60, "the restarted broker to serve its model")
            assert brokers(s)[0] == first and second not in brokers(s)
            np.testing.assert_array_equal(call(client, names[1], shm_region="kill_in"), np.ones((1, 3)))
            wait_for(lambda: lost_worker not in s.pids(), 30, "the dead broker's worker to exit")
            live = set(s.pids())
            wait_for(lambda: all(int(n.split(".")[2][1:]) in live for n in s.segments()), 30,
                     "the dead broker's workers' segments to be swept")
            assert http_get(f"http://{s.http_url}/v2/health/ready")[0] == 200
            client.unregister_system_shared_memory("kill_in")
    finally:
        shm.destroy_shared_memory_region(handle)


def call(client: httpclient.InferenceServerClient, model: str, shm_region: str = "") -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    if shm_region:
        inp.set_shared_memory(shm_region, 12)
    else:
        inp.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def _serves(client: httpclient.InferenceServerClient, model: str) -> bool:
    try:
        call(client, model)
        return True
    except InferenceServerException:
        return False


def test_flags_that_need_one_broker_are_refused(tmp_path):
    repo = tmp_path / "models"
    add_fault_model(repo, "m0")
    for args, text in ((["--broker-shards", "0"], "--broker-shards must be between 1 and 64"),
                       (SHARDS + ["--rate-limit", "execution_count"], "needs --broker-shards=1")):
        s = TritondServer(repo, args).start(wait="exit", timeout=60)
        assert s.returncode != 0 and text in s.log, s.log
        s.assert_clean()


ENSEMBLE = '''name: "{name}"
platform: "ensemble"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{first}" model_version: -1 input_map {{ key: "INPUT0" value: "INPUT0" }}
    output_map {{ key: "OUTPUT0" value: "mid" }} }},
  {{ model_name: "{second}" model_version: -1 input_map {{ key: "INPUT0" value: "mid" }}
    output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }}
] }}
'''


def test_poll_mode_moves_a_model_to_the_broker_of_its_new_ensemble(tmp_path):
    """An ensemble added over models of both brokers joins them in one group: the model of the
    other group's broker unloads there and loads in the group's broker, and the ensemble serves."""
    repo = tmp_path / "models"
    first, second = _names_on_both(1)
    for name in (first, second):
        add_fault_model(repo, name)
    args = SHARDS + ["--model-control-mode=poll", "--repository-poll-secs=1"]
    with serving(TritondServer(repo, args)) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        brokers_before = brokers(s)
        ensemble = "zz_pipeline"        # sorts last: the group goes where the first of the two names does
        home = shard_of(min(first, second), 2)
        mover = first if shard_of(first, 2) != home else second
        staging = tmp_path / ensemble
        (staging / "1").mkdir(parents=True)
        (staging / "config.pbtxt").write_text(ENSEMBLE.format(name=ensemble, first=first, second=second))
        staging.rename(repo / ensemble)

        def moved() -> bool:
            workers = s.worker_pids(mover)
            return len(workers) == 1 and parent(workers[0]) == brokers_before[home]
        wait_for(moved, 60, f"'{mover}' to move to broker {home}")
        wait_for(lambda: _serves(client, ensemble), 60, "the ensemble to serve")
        np.testing.assert_array_equal(call(client, ensemble), np.ones((1, 3)))
        np.testing.assert_array_equal(call(client, mover), np.ones((1, 3)))
        assert brokers(s) == brokers_before
