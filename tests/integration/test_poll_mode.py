"""Poll mode through tritonclient: the repository is rescanned every --repository-poll-secs (and
on SIGHUP); new models load, removed ones unload, a changed config reloads without failing a
request, version directories come and go per the version policy, and a model broken on disk
keeps its loaded version serving with the reason in the index."""
from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, serving, wait_for
from fault_models import add_fault_model
from lifecycle_util import index, infer, model_ready, tag


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("poll") / "models"
    add_fault_model(repo, "echo", tag_output=True, params={"tag": 1})
    add_fault_model(repo, "versioned", extra="version_policy { all { } }")
    add_fault_model(repo, "doomed")
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with serving(TritondServer(repo, ["--model-control-mode=poll", "--repository-poll-secs=1"])) as s:
        yield s


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield c
    c.close()


def set_tag(repo: Path, value: int) -> None:
    path = repo / "echo" / "config.pbtxt"
    path.write_text(path.read_text().replace(f'"{value - 1}"', f'"{value}"'))


def test_a_new_model_directory_loads_and_a_removed_one_unloads(server, repo, client, tmp_path):
    staging = tmp_path / "added"
    add_fault_model(tmp_path, "added")
    shutil.move(staging, repo / "added")
    wait_for(lambda: model_ready(server, "added"), what="the added model to load")
    infer(client, "added")
    shutil.rmtree(repo / "doomed")
    wait_for(lambda: ("doomed", "") not in index(client) and ("doomed", "1") not in index(client),
             what="the removed model to leave the index")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'doomed' is not found"):
        infer(client, "doomed")
    wait_for(lambda: not server.worker_pids("doomed"), what="its worker to stop")


def test_a_changed_config_reloads_without_failing_a_request(server, repo, client):
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def traffic() -> None:
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        while not stop.is_set():
            try:
                seen.append(tag(c, "echo"))
            except InferenceServerException as e:
                failures.append(e.message())
        c.close()

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        set_tag(repo, 2)
        wait_for(lambda: seen and seen[-1] == 2, what="the new config to serve")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == [] and seen[0] == 1 and seen[-1] == 2


def test_version_directories_come_and_go(server, repo, client):
    shutil.copytree(repo / "versioned" / "1", repo / "versioned" / "2")
    wait_for(lambda: model_ready(server, "versioned", "2"), what="version 2 to load")
    assert model_ready(server, "versioned", "1")
    assert infer(client, "versioned").get_response()["model_version"] == "2"
    shutil.rmtree(repo / "versioned" / "2")
    wait_for(lambda: not model_ready(server, "versioned", "2"), what="version 2 to unload")
    assert model_ready(server, "versioned", "1")
    assert infer(client, "versioned").get_response()["model_version"] == "1"


def test_a_model_broken_on_disk_keeps_its_loaded_version_serving(server, repo, client):
    good = (repo / "echo" / "config.pbtxt").read_text()
    (repo / "echo" / "config.pbtxt").write_text(good + "\nmax_batch_size: many\n")
    wait_for(lambda: "reason" in index(client)[("echo", "1")], what="the failed reload")
    entry = index(client)[("echo", "1")]
    assert entry["state"] == "READY" and entry["reason"].startswith("a reload failed, this version still serves")
    assert "max_batch_size" in entry["reason"] and "max_batch_size" in server.log
    before = tag(client, "echo")
    (repo / "echo" / "config.pbtxt").write_text(good.replace(f'"{before}"', f'"{before + 1}"'))
    wait_for(lambda: tag(client, "echo") == before + 1, what="the repaired model to reload")
    assert "reason" not in index(client)[("echo", "1")]


def test_sighup_rescans_at_once(tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    with serving(TritondServer(repo, ["--model-control-mode=poll", "--repository-poll-secs=0"])) as s:
        add_fault_model(repo, "late")
        s.send_signal(signal.SIGHUP)
        wait_for(lambda: model_ready(s, "late"), what="the model to load after SIGHUP")
        assert "SIGHUP: rescanning the model repository" in s.log
