"""Explicit model control through tritonclient: Triton's codes and texts for every load and
unload case, reloads that happen only when something changed and never drop a request, a
failed reload that keeps the old version serving, `file:` overrides (and every name that is
refused), models loading side by side, and concurrent loads and unloads that leave no worker
behind."""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, expect_error, serving, wait_for
from fault_models import MODEL_SOURCE, add_fault_model
from lifecycle_util import index, infer, tag
from tritond.wire import options as wire_options

OVERRIDE_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def markers(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def storm_markers(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("storm-markers")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, markers, storm_markers) -> Path:
    repo = tmp_path_factory.mktemp("control") / "models"
    add_fault_model(repo, "echo", tag_output=True, pid_outputs=True, params={"tag": 1})
    add_fault_model(repo, "broken", params={"mode": "init_raises"})
    add_fault_model(repo, "bad_config")
    (repo / "bad_config" / "config.pbtxt").write_text("max_batch_size: many\n")
    add_fault_model(repo, "empty")
    (repo / "empty" / "1" / "model.py").unlink()
    (repo / "empty" / "1").rmdir()
    for name in ("slow_a", "slow_b", "slow_c"):
        add_fault_model(repo, name, params={"init_ms": 1500, "marker_dir": markers})
    add_fault_model(repo, "storm_a", params={"marker_dir": storm_markers})
    add_fault_model(repo, "storm_b")
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with serving(TritondServer(repo, ["--model-control-mode=explicit", "--load-model=echo",
                                      f"--model-file-override-max-bytes={OVERRIDE_LIMIT}"])) as s:
        yield s


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    yield c
    c.close()


def http_error(call) -> tuple[int, str]:
    e = expect_error(call)
    return int(e.status()), e.message()


def grpc_error(call) -> tuple[str, str]:
    e = expect_error(call, protocol="grpc")
    return e.status(), e.message()


def set_tag(repo: Path, model: str, value: int) -> None:
    path = repo / model / "config.pbtxt"
    lines = [ln for ln in path.read_text().splitlines() if '"tag"' not in ln]
    path.write_text("\n".join(lines + [f'parameters {{ key: "tag" value: {{ string_value: "{value}" }} }}']) + "\n")


# ---------------------------------------------------------------------- Triton's answers

def test_load_and_unload_answer_with_tritons_codes_and_texts(server, client):
    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert http_error(lambda: client.load_model("nope")) == (
        500, "failed to load 'nope', failed to poll from model repository")
    assert grpc_error(lambda: g.load_model("nope")) == (
        "StatusCode.INTERNAL", "failed to load 'nope', failed to poll from model repository")
    assert grpc_error(lambda: g.load_model("../echo")) == (
        "StatusCode.INVALID_ARGUMENT",
        "invalid model name '../echo', model name must not contain path traversal characters")
    status, text = http_error(lambda: client.load_model("broken"))
    assert status == 400 and text.startswith("load failed for model 'broken': version 1 is at UNAVAILABLE state: ")
    assert "initialize failed: the weights file is corrupt" in text
    status, text = http_error(lambda: client.load_model("bad_config"))
    assert status == 400 and text.startswith("load failed for model 'bad_config': ") and "max_batch_size" in text
    assert "'max_batch_size: many': Expected integer, got: many;" in text      # protobuf's C++ words
    assert http_error(lambda: client.load_model("empty")) == (
        400, "load failed for model 'empty': at least one version must be available under the version policy "
             "of model 'empty'\n")
    assert http_error(lambda: client.load_model("echo", files={"file:1/model.py": b"x"})) == (
        400, "Load parameter 'config' must be specified for model file override")
    status, text = http_error(lambda: client.load_model("echo", config="{not json"))
    assert status == 400 and text.startswith("failed to load 'echo', Invalid config override: ")
    client.unload_model("nope")                        # unloading what is not loaded succeeds
    g.unload_model("broken")
    assert client.is_model_ready("echo") and index(client)[("broken", "1")]["state"] == "UNAVAILABLE"
    g.close()


# ---------------------------------------------------------------------- reloads

def test_a_load_reloads_only_when_something_changed(server, repo, client):
    pid = int(infer(client, "echo").as_numpy("PID")[0][0])
    client.load_model("echo")
    assert int(infer(client, "echo").as_numpy("PID")[0][0]) == pid            # nothing changed
    set_tag(repo, "echo", 2)
    client.load_model("echo")
    assert tag(client, "echo") == 2 and server.worker_pids("echo") != [pid]
    config = client.get_model_config("echo")
    config["parameters"]["tag"]["string_value"] = "3"
    client.load_model("echo", config=json.dumps(config))                      # a config always reloads
    assert tag(client, "echo") == 3
    client.load_model("echo")                                                 # back to the repository
    assert tag(client, "echo") == 2
    wait_for(lambda: len(server.worker_pids("echo")) == 1, what="the replaced workers to stop")


def test_reloads_under_traffic_fail_no_request(server, repo, client):
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

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for value in (10, 11):
            set_tag(repo, "echo", value)
            client.load_model("echo")
        good = (repo / "echo" / "config.pbtxt").read_text()
        (repo / "echo" / "config.pbtxt").write_text(good + "\nmax_batch_size: many\n")
        status, text = http_error(lambda: client.load_model("echo"))
        assert status == 400 and "max_batch_size" in text
        served = len(seen)
        wait_for(lambda: len(seen) >= served + 8, what="requests served after the failed reload")
        entry = index(client)[("echo", "1")]
        assert entry["state"] == "READY" and entry["reason"].startswith("a reload failed, this version still serves")
        (repo / "echo" / "config.pbtxt").write_text(good)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == [] and {10, 11} <= set(seen) and seen[-1] == 11


def test_unload_lets_requests_in_flight_finish(server, client, storm_markers):
    client.load_model("storm_a")
    with futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(infer, httpclient.InferenceServerClient(server.http_url), "storm_a", sleep_ms=1500)
        wait_for(lambda: list(storm_markers.glob("busy-*")), what="the request to execute")
        client.unload_model("storm_a")
        assert not client.is_model_ready("storm_a")
        assert slow.result(timeout=30).as_numpy("OUTPUT0").shape == (1, 2)
    wait_for(lambda: index(client)[("storm_a", "1")].get("reason") == "unloaded", what="the unload to finish")
    wait_for(lambda: not server.worker_pids("storm_a"), what="the worker to stop")


# ---------------------------------------------------------------------- file overrides

def override_config(client) -> str:
    config = client.get_model_config("echo")
    config["parameters"]["tag"]["string_value"] = "7"
    return json.dumps(config)


def run_dir(server: TritondServer) -> Path:
    (broker,) = server.role_pids("tritond.broker.main")
    with open(f"/proc/{broker}/cmdline", "rb") as f:
        return Path(wire_options.decode(f.read().split(b"\0")[3]).run_dir)


def test_file_overrides_load_from_a_private_directory_until_the_next_plain_load(server, repo, client):
    source = MODEL_SOURCE.read_bytes()
    before = sorted(p.name for p in (repo / "echo").rglob("*"))
    client.load_model("echo", config=override_config(client), files={"file:1/model.py": source})
    assert tag(client, "echo") == 7
    assert sorted(p.name for p in (repo / "echo").rglob("*")) == before           # the repository is untouched
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.load_model("echo", config=override_config(client), files={"file:1/model.py": source})
    assert tag(client, "echo") == 7
    g.close()
    overrides = run_dir(server) / "overrides"
    wait_for(lambda: len(list(overrides.iterdir())) == 1, what="the replaced override directory to be removed")
    (held,) = overrides.iterdir()
    assert (held / "echo" / "1" / "model.py").read_bytes() == source and oct(held.stat().st_mode)[-3:] == "700"
    client.load_model("echo")
    assert tag(client, "echo") != 7
    wait_for(lambda: not any(overrides.iterdir()), what="the override directory to be removed")


def test_file_overrides_load_a_model_the_repository_does_not_hold(server, repo, client):
    """As Triton's repository manager: a load with `file:` overrides polls no repository for
    the model, so a new name loads from the overrides alone (and stays out of the repository)."""
    config = json.loads(override_config(client))
    config["name"] = "fresh"
    files = {"file:1/model.py": MODEL_SOURCE.read_bytes()}
    status, text = http_error(lambda: client.load_model("fresh", config=json.dumps(config),
                                                        files={"file:../../x": b"pwned"}))
    assert status == 400 and "must stay within model directory" in text, text
    client.load_model("fresh", config=json.dumps(config), files=files)
    assert client.is_model_ready("fresh") and tag(client, "fresh") == 7
    assert not (repo / "fresh").exists()
    overrides = run_dir(server) / "overrides"
    assert [p.name for d in overrides.iterdir() for p in d.iterdir()] == ["fresh"]
    g = grpcclient.InferenceServerClient(server.grpc_url)
    g.load_model("fresh", config=json.dumps(config), files=files)
    assert g.is_model_ready("fresh")
    g.close()
    expect_error(lambda: client.load_model("fresh"), 500,
                 "failed to load 'fresh', failed to poll from model repository")
    assert client.is_model_ready("fresh")          # a failed plain load leaves the loaded model alone
    client.unload_model("fresh")
    wait_for(lambda: not client.is_model_ready("fresh") and not any(overrides.iterdir()),
             what="'fresh' to unload and its override directory to be removed")


def test_override_names_that_could_leave_the_directory_are_refused(server, client, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    link = Path("/tmp") / f"tritond-test-escape-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    config = override_config(client)
    try:
        for name in ["file:../../x", "file:1/../../x", "file:/../x", "file:../" + link.name + "/x",
                     "file:1/a\\b", "file:1/nul\0x"]:
            status, text = http_error(lambda: client.load_model("echo", config=config, files={name: b"pwned"}))
            assert status == 400, (name, text)
            assert "must stay within model directory" in text or "must not contain NUL" in text, (name, text)
        status, text = http_error(lambda: client.load_model(
            "echo", config=config, files={"file:1/model.py": b"x" * (OVERRIDE_LIMIT + 1)}))
        assert status == 400 and "--model-file-override-max-bytes" in text
        status, text = http_error(lambda: client.load_model(
            "echo", config=config, files={"file:1/a": b"x", "file:1/a/b": b"y"}))
        assert status == 400 and "directory has been created as a file" in text
        client.load_model("echo", config=config, files={"file:/1/model.py": MODEL_SOURCE.read_bytes(),
                                                         f"file:{outside}/x": b"inside"})
        assert tag(client, "echo") == 7, "as Triton joins them: a leading / names the model directory"
    finally:
        link.unlink()
    assert list(outside.iterdir()) == []
    client.load_model("echo")
    wait_for(lambda: not any((run_dir(server) / "overrides").iterdir()), what="the override directory to be removed")


def test_python_model_names_tritons_stub_refuses_fail_their_load(server, client):
    """As Triton's python backend: an instance name holding a shell metacharacter is refused."""
    config = json.loads(override_config(client))
    config["name"] = "model;test"
    status, text = http_error(lambda: client.load_model(
        "model;test", config=json.dumps(config), files={"file:1/model.py": MODEL_SOURCE.read_bytes()}))
    assert status == 400 and "Invalid stub name: contains invalid characters" in text, text
    assert not client.is_model_ready("model;test")
    config["name"] = "model'test'"      # refused before its model.py is compiled, as Triton's stub refuses it
    status, text = http_error(lambda: client.load_model(
        "model'test'", config=json.dumps(config), files={"file:1/model.py": b"print('model'test'')"}))
    assert status == 400 and "Invalid stub name: contains invalid characters" in text, text
    config["name"] = "model\\test"      # a backslash is a name's own character, as in Triton
    status, text = http_error(lambda: client.load_model(
        "model\\test", config=json.dumps(config), files={"file:1/model.py": MODEL_SOURCE.read_bytes()}))
    assert status == 400 and "Invalid stub name: contains invalid characters" in text, text
    wait_for(lambda: not any((run_dir(server) / "overrides").iterdir()), what="the failed load's overrides to be removed")


def test_a_config_naming_another_directory_fails_the_poll(server, client):
    """As Triton's repository manager: the name is checked before the backend sees the model, and
    a load request it refuses is answered 'failed to poll from model repository' (500), the reason
    logged (curl's globbing loads 'model{test}' as 'modeltest': qa/L0_backend_python model_control)."""
    config = json.loads(override_config(client))
    config["name"] = "model{test}"
    for load in (lambda: client.load_model("modeltest", config=json.dumps(config),
                                           files={"file:1/model.py": MODEL_SOURCE.read_bytes()}),
                 lambda: client.load_model("modeltest", config=json.dumps(config))):
        assert http_error(load) == (500, "failed to load 'modeltest', failed to poll from model repository")
    wait_for(lambda: "Poll failed for model directory 'modeltest': model 'model{test}'" in server.log,
             what="the poll failure's reason in the log")
    assert not client.is_model_ready("modeltest") and client.is_model_ready("echo")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc_error(lambda: g.load_model("modeltest", config=json.dumps(config))) == (
        "StatusCode.INTERNAL", "failed to load 'modeltest', failed to poll from model repository")
    g.close()
    wait_for(lambda: not any((run_dir(server) / "overrides").iterdir()), what="the failed load's overrides to be removed")


def test_override_name_the_file_system_refuses_is_an_internal_error(server, client):
    """A component over NAME_MAX: Triton answers 500 'failed to poll from model repository'
    (qa/L0_http http_test.py test_load_oversized_file_parameter) and stays up."""
    status, text = http_error(lambda: client.load_model(
        "echo", config=override_config(client), files={"file:" + "A" * 256: b"a"}))
    assert status == 500 and "failed to poll from model repository" in text, text
    assert client.is_server_live() and client.is_model_ready("echo")
    assert not any((run_dir(server) / "overrides").iterdir())


# ---------------------------------------------------------------------- concurrency

def test_models_load_side_by_side_while_the_broker_serves(server, client, markers):
    def load(model: str) -> None:
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        c.load_model(model)
        c.close()

    with futures.ThreadPoolExecutor(3) as pool:
        loads = [pool.submit(load, n) for n in ("slow_a", "slow_b", "slow_c")]
        served = 0
        while not all(f.done() for f in loads):
            infer(client, "echo")
            served += 1
        for f in loads:
            f.result()
    spans = sorted(tuple(map(int, ln.split()[:2])) for ln in (markers / "init-spans").read_text().splitlines())
    assert len(spans) == 3 and spans[1][0] < spans[0][1] and spans[2][0] < spans[0][1]   # all three overlapped
    assert served > 3


def test_concurrent_loads_and_unloads_leave_no_worker_behind(server, client):
    """Issue 14: 200 mixed load/unload calls for two models, 16 at a time."""
    import random
    rng = random.Random(14)
    calls = [(rng.choice(("storm_a", "storm_b")), rng.random() < 0.5) for _ in range(200)]

    def call(model: str, load: bool) -> str:
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        try:
            (c.load_model if load else c.unload_model)(model)
            return ""
        except InferenceServerException as e:
            return e.message()
        finally:
            c.close()

    with futures.ThreadPoolExecutor(16) as pool:
        errors = [e for e in pool.map(lambda a: call(*a), calls) if e]
    assert errors == []
    for model in ("storm_a", "storm_b"):
        client.unload_model(model)
    wait_for(lambda: not server.worker_pids("storm_a") and not server.worker_pids("storm_b"), timeout=30,
             what="every storm worker to stop")
    time.sleep(1.0)                         # and none comes back
    assert not server.worker_pids("storm_a") and not server.worker_pids("storm_b")
    assert client.is_model_ready("echo")


def test_a_startup_model_no_repository_holds_stops_startup(tmp_path):
    """Triton refuses to start when an explicit-mode --load-model names a model no repository
    holds (with --exit-on-error, the default), logging its poll failure."""
    repo = tmp_path / "models"
    add_fault_model(repo, "present")
    s = TritondServer(repo, ["--model-control-mode=explicit", "--load-model=present",
                             "--load-model=nonexistent_model"]).start(wait="exit")
    assert s.returncode == 1
    assert "failed to poll model 'nonexistent_model': model not found in any model repository" in s.log, s.log
    s.assert_clean()


MANAGER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Loads and unloads models itself (pb_utils' model control), in initialize() too; answers
    with what it saw."""

    def initialize(self, args):
        pb_utils.load_model("storm_a")
        self.at_init = pb_utils.is_model_ready("storm_a")
        pb_utils.unload_model("storm_a")

    def execute(self, requests):
        params = json.loads(requests[0].parameters())
        seen = [self.at_init, pb_utils.is_model_ready("storm_b")]
        pb_utils.load_model("storm_b")
        seen += [pb_utils.is_model_ready("storm_b"), pb_utils.is_model_ready("storm_b", "1"),
                 pb_utils.is_model_ready("storm_b", "2")]
        pb_utils.unload_model("storm_b")
        seen.append(pb_utils.is_model_ready("storm_b"))
        files = {"file:1/model.py": open(params["source"], "rb").read()}
        pb_utils.load_model("from_files", params["config"], files)
        seen.append(pb_utils.is_model_ready("from_files"))
        for args in (("no_such_model",), ("from_files", "", files), ("storm_b", "{not json")):
            try:
                pb_utils.load_model(*args)
                seen.append("loaded")
            except pb_utils.TritonModelException as e:
                seen.append(str(e))
        out = np.array([json.dumps(seen).encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
'''


def test_a_python_model_loads_and_unloads_models_itself(server, repo, client):
    """pb_utils.load_model (with a config and `file:` overrides), unload_model and is_model_ready,
    answered as a client's requests are (L0_backend_python/bls bls_model_loading)."""
    (repo / "manager" / "1").mkdir(parents=True)
    (repo / "manager" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [{ name: "X" data_type: TYPE_INT32 dims: [1] }]\n'
        'output [{ name: "OUT" data_type: TYPE_STRING dims: [1] }]\n')
    (repo / "manager" / "1" / "model.py").write_text(MANAGER)
    client.load_model("manager")
    config = json.loads(override_config(client))
    config["name"] = "from_files"
    inp = httpclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    result = client.infer("manager", [inp], parameters={"config": json.dumps(config), "source": str(MODEL_SOURCE)})
    seen = json.loads(result.as_numpy("OUT")[0])
    assert seen[:7] == [True, False, True, True, False, False, True]
    assert seen[7].startswith("failed to load 'no_such_model'"), seen[7]
    assert seen[8] == "Load parameter 'config' must be specified for model file override"
    assert seen[9].startswith("failed to load 'storm_b', Invalid config override"), seen[9]
    assert client.is_model_ready("from_files") and not client.is_model_ready("storm_b")
    client.unload_model("from_files")
    client.unload_model("manager")
    wait_for(lambda: not any((run_dir(server) / "overrides").iterdir()), what="the override directory to be removed")
