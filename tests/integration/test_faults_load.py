"""Models that fail to initialize or crash in a loop: the model is UNAVAILABLE with the reason
in the repository index and the log, the server and the other models carry on, and nothing
restarts forever."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, http_get, serving, wait_for
from fault_models import add_fault_model

def build(repo: Path, markers: Path, models: dict[str, str]) -> Path:
    for name, mode in models.items():
        add_fault_model(repo, name, batching=None, params={"mode": mode, "marker_dir": markers})
    return repo


def infer(url: str, model: str):
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    try:
        return client.infer(model, [inp])
    finally:
        client.close()


def index_entry(server: TritondServer, model: str) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    return next(m for m in client.get_model_repository_index() if m["name"] == model)


def model_ready(server: TritondServer, model: str) -> bool:
    return http_get(f"http://{server.http_url}/v2/models/{model}/ready", 2.0)[0] == 200


@pytest.fixture(scope="module")
def lserver(tmp_path_factory):
    markers = tmp_path_factory.mktemp("markers")
    repo = build(tmp_path_factory.mktemp("load") / "models", markers, {
        "broken_init": "init_raises",
        "reload_fails": "init_raises_after_first",
        "dies_on_request": "exit_on_request",
        "healthy": "",
    })
    with serving(TritondServer(repo, ["--exit-on-error=false"]), wait="live") as s:
        wait_for(lambda: model_ready(s, "healthy"), 90, "healthy to load")
        yield s


def assert_healthy(server: TritondServer) -> None:
    assert http_get(f"http://{server.http_url}/v2/health/live")[0] == 200
    np.testing.assert_array_equal(infer(server.http_url, "healthy").as_numpy("OUTPUT0"), np.ones((1, 2)))


def test_exception_in_initialize_makes_only_that_model_unavailable(lserver):
    entry = index_entry(lserver, "broken_init")
    assert entry["state"] == "UNAVAILABLE"
    assert "initialize failed: the weights file is corrupt" in entry["reason"]
    assert "initialize failed: the weights file is corrupt" in lserver.log
    assert not model_ready(lserver, "broken_init")
    assert http_get(f"http://{lserver.http_url}/v2/health/ready")[0] != 200
    with pytest.raises(InferenceServerException):
        infer(lserver.http_url, "broken_init")
    assert lserver.worker_pids("broken_init") == []
    assert_healthy(lserver)


def test_crash_loop_in_initialize_marks_the_model_failed(lserver):
    [pid] = lserver.worker_pids("reload_fails")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: "not restarted" in index_entry(lserver, "reload_fails").get("reason", ""), 90,
             "reload_fails to be marked failed")
    entry = index_entry(lserver, "reload_fails")
    assert entry["state"] == "UNAVAILABLE"
    assert "initialize failed on reload" in entry["reason"], entry
    assert "not restarted" in lserver.log
    time.sleep(1.0)                         # and nothing restarts it
    assert lserver.worker_pids("reload_fails") == []
    assert_healthy(lserver)


def test_crash_loop_on_every_request_marks_the_model_failed(lserver):
    failures = 0
    while "not restarted" not in index_entry(lserver, "dies_on_request").get("reason", ""):
        wait_for(lambda: model_ready(lserver, "dies_on_request") or
                 "not restarted" in index_entry(lserver, "dies_on_request").get("reason", ""), 90,
                 "dies_on_request to be ready or failed")
        if not model_ready(lserver, "dies_on_request"):
            break
        with pytest.raises(InferenceServerException) as info:
            infer(lserver.http_url, "dies_on_request")
        assert "exit code 3" in info.value.message()
        failures += 1
        assert failures <= 10, "the crash loop was never stopped"
    entry = index_entry(lserver, "dies_on_request")
    assert entry["state"] == "UNAVAILABLE" and "exit code 3" in entry["reason"]
    assert failures == 6
    assert lserver.worker_pids("dies_on_request") == []
    assert_healthy(lserver)


def test_initialize_failure_exits_non_zero_with_exit_on_error(tmp_path):
    repo = build(tmp_path / "models", tmp_path, {"broken_init": "init_raises", "healthy": ""})
    s = TritondServer(repo).start(wait="exit")
    assert s.returncode == 1
    assert "initialize failed: the weights file is corrupt" in s.log
    s.assert_clean()
