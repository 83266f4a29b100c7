"""Worker faults through the real clients: a dead, stopped, looping, crashing or memory-hungry
worker costs only the requests it was executing, is replaced, and the server tells the truth
about it meanwhile. Every test ends with the server live, another model serving, no orphan
worker; the module ends with a clean stop and no shared-memory segment left."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, expect_error, http_get, metric, serving, wait_for
from fault_models import add_fault_model

MODELS = {
    # name: (instances, max_batch_size, queue delay in us, extra parameters)
    "slow2": (2, 8, 1000, {}),
    "faulty": (1, 4, 100000, {"execution_timeout_seconds": "2", "memory_limit_bytes": str(768 << 20)}),
    "idem": (1, 4, 1000, {"idempotent": "true"}),
    "idem2": (2, 8, 1000, {"idempotent": "true"}),
    "other": (1, 4, 0, {}),
}


@pytest.fixture(scope="module")
def markers(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def fserver(tmp_path_factory, markers):
    repo = tmp_path_factory.mktemp("faults") / "models"
    for name, (count, mbs, delay, params) in MODELS.items():
        add_fault_model(repo, name, count=count, max_batch=mbs, batching=f"max_queue_delay_microseconds: {delay}",
                        params=dict(params, marker_dir=markers), pid_outputs=True)
    add_ensemble(repo, "idem_ens", "idem2")
    with serving(TritondServer(repo, ["--allow-client-shm=true"])) as s:
        yield s


def add_ensemble(repo: Path, name: str, step: str) -> None:
    """An ensemble of one step, `step` (INPUT0 -> OUTPUT0)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}" platform: "ensemble" max_batch_size: 8 '
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }] '
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }] '
        f'ensemble_scheduling {{ step [{{ model_name: "{step}" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }] }')


def infer(url: str, model: str, request_id: str = "", timeout: float = 60.0, values: np.ndarray | None = None,
          **params):
    client = httpclient.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout)
    try:
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4) if values is None else values)
        return client.infer(model, [inp], request_id=request_id, parameters=params or None)
    finally:
        client.close()


def model_ready(server: TritondServer, model: str) -> bool:
    return http_get(f"http://{server.http_url}/v2/models/{model}/ready", 2.0)[0] == 200


def wait_serving(server: TritondServer, model: str, instances: int) -> list[int]:
    """Wait until `model` is ready with `instances` live workers; return their pids."""
    wait_for(lambda: model_ready(server, model) and
             metric(server, "tritond_model_ready_instances", model=model) == instances, what=f"{model} ready")
    pids = server.worker_pids(model)
    assert len(pids) == instances, (pids, server.log)
    return pids


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_healthy(server: TritondServer, gone: list[int] = ()) -> None:
    """Server live, an unrelated model serving, the dead workers gone for good."""
    assert http_get(f"http://{server.http_url}/v2/health/live")[0] == 200
    assert infer(server.http_url, "other").as_numpy("OUTPUT0").shape == (1, 4)
    for pid in gone:
        wait_for(lambda: not pid_alive(pid), 10, f"pid {pid} to be gone")


def stop_while_busy(markers: Path, pid: int, timeout: float = 30.0) -> list[str]:
    """SIGSTOP worker `pid` inside execute(); return the request ids of the batch it holds.

    The model writes the marker on entering execute() and removes it before returning, so
    with the worker frozen the marker says exactly which batch is inside it."""
    path = markers / f"busy-{pid}"

    def stopped_inside() -> list[str] | None:
        os.kill(pid, signal.SIGSTOP)
        if path.exists():
            return json.loads(path.read_text())
        os.kill(pid, signal.SIGCONT)
        return None
    return wait_for(stopped_inside, timeout, f"worker {pid} to execute a batch", every=0.01)


def assert_no_internals(message: str) -> None:
    for secret in ("/dev/shm", "tritond.", "ipc://", ".sock", "/tmp"):
        assert secret not in message, message


class Load:
    """`n` clients in threads, each sending requests back to back until stopped, each with its
    own input values; an answer whose OUTPUT0 is not its input is listed in `wrong`."""

    def __init__(self, url: str, model: str, n: int, **params) -> None:
        self.url, self.model, self.params = url, model, params
        self.stop = threading.Event()
        self.ok: list[str] = []
        self.wrong: list[str] = []
        self.failed: dict[str, InferenceServerException] = {}
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(n)]

    def client(self, i: int) -> None:
        k = 0
        while not self.stop.is_set():
            rid = f"c{i}-{k}"
            k += 1
            values = np.arange(4, dtype=np.float32).reshape(1, 4) + (i * 100000 + k)
            try:
                result = infer(self.url, self.model, rid, values=values, **self.params)
                self.ok.append(rid)
                if not np.array_equal(result.as_numpy("OUTPUT0"), values):
                    self.wrong.append(rid)
            except InferenceServerException as e:
                self.failed[rid] = e

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


def kill_mid_batch(fserver, markers, model: str, served_after: int) -> tuple[list[int], list[int], "Load", list]:
    """Under 32 clients, SIGKILL the first of `model`'s two workers while it holds a batch and
    wait for its replacement to serve `served_after` more requests; (pids before, pids after,
    the load, the killed batch's request ids)."""
    pids = wait_serving(fserver, model, 2)
    restarts = metric(fserver, "tritond_model_restart_count", model=model)
    with Load(fserver.http_url, model, 32, sleep_ms=300) as load:
        batch = stop_while_busy(markers, pids[0])
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: metric(fserver, "tritond_model_restart_count", model=model) == restarts + 1,
                 what="the restart to be counted")
        new_pids = wait_serving(fserver, model, 2)
        served = len(load.ok)
        wait_for(lambda: len(load.ok) > served + served_after, what="requests served after the restart")
    return pids, new_pids, load, batch


def test_kill_worker_mid_batch_fails_only_that_batch(fserver, markers):
    pids, new_pids, load, batch = kill_mid_batch(fserver, markers, "slow2", 16)
    victim = pids[0]
    assert victim not in new_pids and pids[1] in new_pids
    assert batch and sorted(load.failed) == sorted(batch), (batch, load.failed)
    assert not load.wrong
    for e in load.failed.values():
        assert e.status() == "503"
        assert "'slow2'" in e.message() and "died" in e.message() and "signal 9" in e.message(), e.message()
        assert_no_internals(e.message())
    assert "instance" in fserver.log and f"pid {victim}" in fserver.log
    assert_healthy(fserver, [victim])


def test_stopped_worker_is_replaced_after_heartbeat_loss(fserver, markers):
    pids = wait_serving(fserver, "slow2", 2)
    with Load(fserver.http_url, "slow2", 4, sleep_ms=200) as load:
        victim = pids[0]
        batch = stop_while_busy(markers, victim)
        wait_for(lambda: not pid_alive(victim), what="the stopped worker to be killed")
        wait_serving(fserver, "slow2", 2)
    assert batch and sorted(load.failed) == sorted(batch)
    for e in load.failed.values():
        assert e.status() == "503" and "'slow2'" in e.message() and "heartbeat" in e.message(), e.message()
    assert_healthy(fserver, [victim])


def test_infinite_loop_is_killed_at_the_execution_deadline(fserver):
    [pid] = wait_serving(fserver, "faulty", 1)
    t0 = time.monotonic()
    e = expect_error(lambda: infer(fserver.http_url, "faulty", fault="loop"), 503, "execution timeout of 2 s")
    assert time.monotonic() - t0 >= 2.0
    assert "'faulty'" in e.message()
    wait_serving(fserver, "faulty", 1)
    infer(fserver.http_url, "faulty")
    assert_healthy(fserver, [pid])


def test_exception_in_execute_fails_the_batch_and_keeps_the_worker(fserver):
    [pid] = wait_serving(fserver, "faulty", 1)
    expect_error(lambda: infer(fserver.http_url, "faulty", fault="raise"), 500, "execute refused this batch")
    assert fserver.worker_pids("faulty") == [pid]
    infer(fserver.http_url, "faulty")
    assert_healthy(fserver)


def test_error_for_one_request_fails_only_that_request(fserver):
    [pid] = wait_serving(fserver, "faulty", 1)
    results: dict[int, object] = {}

    def send(i: int) -> None:
        try:
            results[i] = infer(fserver.http_url, "faulty", **({"fault": "error"} if i == 2 else {}))
        except InferenceServerException as e:
            results[i] = e

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failed = {i for i, r in results.items() if isinstance(r, InferenceServerException)}
    assert failed == {2}
    assert "this request was refused" in results[2].message()
    sizes = {int(r.as_numpy("BATCH_SIZE")[0, 0]) for i, r in results.items() if i != 2}
    assert sizes == {4}, "the four requests did not share one batch"
    assert fserver.worker_pids("faulty") == [pid]
    assert_healthy(fserver)


@pytest.mark.parametrize("fault, how", [
    ("exit", "exit code 7"),
    ("abort", "signal 6 (SIGABRT)"),
    ("segv", "signal 11 (SIGSEGV)"),
    ("memory", "out of memory"),
    ("alloc", "out of memory"),
])
def test_crashing_execute_is_contained_and_restarted(fserver, fault, how):
    [pid] = wait_serving(fserver, "faulty", 1)
    bystanders = sorted(fserver.worker_pids("slow2") + fserver.worker_pids("other"))
    e = expect_error(lambda: infer(fserver.http_url, "faulty", fault=fault), 503, how)
    assert "'faulty'" in e.message(), e.message()
    assert_no_internals(e.message())
    [new] = wait_serving(fserver, "faulty", 1)
    assert new != pid
    assert sorted(fserver.worker_pids("slow2") + fserver.worker_pids("other")) == bystanders
    infer(fserver.http_url, "faulty")
    assert_healthy(fserver, [pid])


def test_idempotent_model_retries_once_on_the_replacement(fserver, markers):
    [pid] = wait_serving(fserver, "idem", 1)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", infer(fserver.http_url, "idem", "retry-me", sleep_ms=1500)))
    t.start()
    assert stop_while_busy(markers, pid) == ["retry-me"]
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    result = box["r"]
    assert result.as_numpy("PID")[0, 0] != pid
    assert_healthy(fserver, [pid])


def test_kill_worker_mid_batch_of_an_idempotent_model_fails_nothing(fserver, markers):
    wait_serving(fserver, "idem2", 2)
    retries = metric(fserver, "tritond_inference_request_retry", model="idem2")
    pids, new_pids, load, batch = kill_mid_batch(fserver, markers, "idem2", 32)
    victim = pids[0]
    assert victim not in new_pids
    assert batch and not load.failed, {k: e.message() for k, e in load.failed.items()}
    assert not load.wrong and set(batch) <= set(load.ok)
    assert metric(fserver, "tritond_inference_request_retry", model="idem2") == retries + len(batch)
    assert f"running {len(batch)} request(s) again after instance" in fserver.log
    assert all(rid in fserver.log for rid in batch)
    assert not [n for n in fserver.segments() if f".w{victim}." in n]
    assert_healthy(fserver, [victim])


def test_an_input_that_kills_every_worker_fails_after_one_retry(fserver):
    pids = wait_serving(fserver, "idem2", 2)
    failures = metric(fserver, "tritond_inference_request_retry_failure", model="idem2")
    e = expect_error(lambda: infer(fserver.http_url, "idem2", "poison", fault="exit"), 503, "while running it again")
    assert "'idem2'" in e.message() and e.message().count("died (exit code 7)") == 2, e.message()
    assert_no_internals(e.message())
    assert metric(fserver, "tritond_inference_request_retry_failure", model="idem2") == failures + 1
    gone = [pid for pid in pids if pid not in wait_serving(fserver, "idem2", 2)]
    assert gone
    assert infer(fserver.http_url, "idem2", values=np.full((1, 4), 5, np.float32)).as_numpy("OUTPUT0")[0, 0] == 5
    assert_healthy(fserver, gone)


def test_a_retried_request_keeps_its_client_shared_memory_until_it_is_answered(fserver, markers):
    """The client unregisters its regions while the request is inside a worker; the worker is
    killed; the regions stay listed while the retry runs, which reads the input and writes the
    output through them, and go once it is answered."""
    [pid] = wait_serving(fserver, "idem", 1)
    values = np.arange(4, dtype=np.float32).reshape(1, 4) * 7
    handles = [shm.create_shared_memory_region(name, f"/{name}_{os.getpid()}", 16) for name in ("retry_in", "retry_out")]
    client = httpclient.InferenceServerClient(fserver.http_url, network_timeout=60)
    try:
        shm.set_shared_memory_region(handles[0], [values])
        shm.set_shared_memory_region(handles[1], [np.zeros((1, 4), np.float32)])
        for name in ("retry_in", "retry_out"):
            client.register_system_shared_memory(name, f"/{name}_{os.getpid()}", 16)
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_shared_memory("retry_in", 16)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("retry_out", 16)
        box: dict[str, object] = {}

        def send() -> None:     # its own client: one InferenceServerClient serves one thread
            c = httpclient.InferenceServerClient(fserver.http_url, network_timeout=60)
            try:
                box["r"] = c.infer("idem", [inp], outputs=[out], request_id="shm-retry", parameters={"sleep_ms": 1500})
            finally:
                c.close()
        t = threading.Thread(target=send)
        t.start()
        assert stop_while_busy(markers, pid) == ["shm-retry"]
        client.unregister_system_shared_memory()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "request id(s) shm-retry" in fserver.log, what="the retry to be logged")
        in_use = {r["name"] for r in client.get_system_shared_memory_status()}
        assert in_use == {"retry_in", "retry_out"}         # unregistered, still held by the retry
        t.join(60)
        assert box["r"].get_output("OUTPUT0") is not None
        assert np.array_equal(shm.get_contents_as_numpy(handles[1], np.float32, [1, 4]), values)
        assert client.get_system_shared_memory_status() == []
    finally:
        client.unregister_system_shared_memory()
        client.close()
        for h in handles:
            shm.destroy_shared_memory_region(h)
    assert_healthy(fserver, [pid])


def busy_with(markers: Path, pids: list[int], rid: str) -> int:
    """The worker among `pids` whose execute() holds request `rid`."""
    def holder() -> int | None:
        for pid in pids:
            path = markers / f"busy-{pid}"
            try:
                if rid in json.loads(path.read_text()):
                    return pid
            except (OSError, ValueError):
                continue
        return None
    return wait_for(holder, 30, f"a worker to execute {rid}", every=0.01)


def test_an_ensemble_step_is_retried_by_its_own_models_setting(fserver, markers):
    pids = wait_serving(fserver, "idem2", 2)
    box: dict[str, object] = {}
    values = np.full((1, 4), 3, np.float32)
    t = threading.Thread(target=lambda: box.setdefault(
        "r", infer(fserver.http_url, "idem_ens", "ens-step", values=values, sleep_ms=1500)))
    t.start()
    victim = busy_with(markers, pids, "ens-step")
    os.kill(victim, signal.SIGKILL)
    t.join(60)
    assert np.array_equal(box["r"].as_numpy("OUTPUT0"), values)
    wait_serving(fserver, "idem2", 2)
    assert_healthy(fserver, [victim])


def test_readiness_is_false_while_no_instance_can_serve(fserver, markers):
    [pid] = wait_serving(fserver, "faulty", 1)
    assert http_get(f"http://{fserver.http_url}/v2/health/ready")[0] == 200
    hold = markers / "hold_init"
    hold.touch()
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not model_ready(fserver, "faulty"), what="faulty to be not ready")
        wait_for(lambda: fserver.worker_pids("faulty"), what="the replacement to start")
        assert http_get(f"http://{fserver.http_url}/v2/health/ready")[0] != 200
        index = httpclient.InferenceServerClient(fserver.http_url).get_model_repository_index()
        entry = next(m for m in index if m["name"] == "faulty")
        assert entry["state"] == "UNAVAILABLE" and "signal 9" in entry["reason"]
        assert model_ready(fserver, "other")
    finally:
        hold.unlink()
    wait_serving(fserver, "faulty", 1)
    assert http_get(f"http://{fserver.http_url}/v2/health/ready")[0] == 200
    assert_healthy(fserver, [pid])
