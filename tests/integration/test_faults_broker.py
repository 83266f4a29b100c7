"""Broker death: the supervisor restarts it, frontends answer 503 meanwhile and reconnect,
the dead broker's workers exit with it, and no stale segment stays; a broker that cannot be
restarted makes the server exit non-zero."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, http_get, serving, wait_for
from fault_models import add_fault_model, started

def build(repo: Path, markers: Path | None = None) -> Path:
    for name, count in (("pair", 2), ("other", 1)):
        add_fault_model(repo, name, count=count, params={"marker_dir": markers} if markers else None)
    return repo

def infer(url: str, model: str, **params):
    client = httpclient.InferenceServerClient(url, network_timeout=60, connection_timeout=60)
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    try:
        return client.infer(model, [inp], parameters=params or None)
    finally:
        client.close()


def owners_alive(server: TritondServer) -> None:
    """Every segment belongs to a live process of this server (w<pid> or f<pid>)."""
    live = set(server.pids())
    for name in server.segments():
        owner = name.split(".")[2]
        assert int(owner[1:]) in live, f"stale segment of a dead process: {owner}"


def test_broker_killed_is_restarted_and_frontends_reconnect(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    with serving(TritondServer(build(tmp_path / "models", markers))) as s:
        infer(s.http_url, "pair")
        [broker] = s.role_pids("tritond.broker.main")
        workers = s.worker_pids()
        assert len(workers) == 3
        frontends = s.role_pids("tritond.frontend")
        outcomes: list[object] = []

        def slow_request() -> None:
            try:
                outcomes.append(infer(s.http_url, "pair", sleep_ms=3000))
            except InferenceServerException as e:
                outcomes.append(e)

        inflight = [threading.Thread(target=slow_request) for _ in range(2)]
        for t in inflight:
            t.start()
        wait_for(lambda: started(markers) == 3, 30, "the two slow requests to execute")
        os.kill(broker, signal.SIGKILL)
        for pid in workers:
            wait_for(lambda: pid not in s.pids(), 10, f"worker {pid} of the dead broker to exit")
        for t in inflight:
            t.join(60)
        assert len(outcomes) == 2
        for e in outcomes:
            assert isinstance(e, InferenceServerException) and e.status() == "503", e
        wait_for(lambda: http_get(f"http://{s.http_url}/v2/health/ready")[0] == 200, 45, "ready again")
        [new_broker] = s.role_pids("tritond.broker.main")
        assert new_broker != broker
        assert s.role_pids("tritond.frontend") == frontends
        assert len(s.worker_pids()) == 3 and not set(s.worker_pids()) & set(workers)
        np.testing.assert_array_equal(infer(s.http_url, "pair").as_numpy("OUTPUT0"), np.ones((1, 3)))
        infer(s.http_url, "other")
        owners_alive(s)
        assert "the broker is back" in s.log


def test_broker_that_cannot_restart_makes_the_server_exit_non_zero(tmp_path):
    repo = build(tmp_path / "models")
    with serving(TritondServer(repo), code=3) as s:
        [broker] = s.role_pids("tritond.broker.main")
        repo.rename(tmp_path / "gone")
        os.kill(broker, signal.SIGKILL)
        s.proc.wait(60)
    assert "could not restart the broker" in s.log


def test_supervisor_killed_takes_every_process_and_segment_with_it(tmp_path):
    with serving(TritondServer(build(tmp_path / "models")), code=None) as s:
        infer(s.http_url, "pair")
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(10)
        wait_for(lambda: not s.pids(), 60, "every process of the server to exit")
        wait_for(lambda: not s.segments(), 10, "every segment to be removed")
