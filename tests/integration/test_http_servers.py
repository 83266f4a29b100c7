"""HTTP behaviour that needs a server of its own: size limits, a bad model beside good ones,
SIGTERM with requests in flight, several HTTP frontend processes, and hypercorn.

Each server serves a small copy of part of the example repository, so it starts quickly.
"""
from __future__ import annotations

import gzip
import http.client
import json
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, http_get, metric, serving, socket_inodes, tcp_connections, wait_for
from fault_models import add_fault_model, started

LIMIT = 64 * 1024
HINT = "Use --http-max-input-size to increase the limit."


def small_repo(example_repo: Path, dest: Path, models: list[str]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for m in models:
        shutil.copytree(example_repo / m, dest / m)
    return dest


def post(server: TritondServer, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def identity(client: httpclient.InferenceServerClient, x: np.ndarray, model: str = "identity_fp32") -> np.ndarray:
    t = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return client.infer(model, [t]).as_numpy("OUTPUT0")


# ------------------------------------------------------------------------- --http-max-input-size

@pytest.fixture(scope="module")
def limited(example_repo, tmp_path_factory):
    repo = small_repo(example_repo, tmp_path_factory.mktemp("limited"), ["identity_fp32"])
    with serving(TritondServer(repo, [f"--http-max-input-size={LIMIT}"])) as s:
        yield s


def test_raw_body_over_limit(limited):
    status, _, body = post(limited, "/v2/models/identity_fp32/infer", b"\0" * (LIMIT + 4),
                           {"Inference-Header-Content-Length": "0"})
    assert (status, json.loads(body)) == (400, {
        "error": f"Raw input has a byte_size ({LIMIT + 4} bytes) that exceeds the maximum allowed value of {LIMIT} "
                 f"bytes. {HINT}"})


def test_json_body_over_limit(limited):
    doc = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
    body = json.dumps(doc).encode()[:-1] + b" " * LIMIT + b"}"
    status, _, data = post(limited, "/v2/models/identity_fp32/infer", body)
    assert (status, json.loads(data)) == (400, {
        "error": f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of {LIMIT} bytes. "
                 f"{HINT}"})


def test_json_input_over_limit(limited):
    """A body under the limit whose JSON data decodes to more bytes than the limit."""
    n = LIMIT // 4 + 16
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "FP32", "data": [1] * n}]}).encode()
    assert len(body) < LIMIT
    status, _, data = post(limited, "/v2/models/identity_fp32/infer", body)
    assert (status, json.loads(data)) == (400, {
        "error": f"JSON input 'INPUT0' has a byte_size ({n * 4} bytes) that exceeds the maximum allowed value of "
                 f"{LIMIT} bytes. {HINT}"})


def test_binary_request_over_limit_through_client(limited):
    client = httpclient.InferenceServerClient(limited.http_url)
    x = np.zeros(1 << 20, np.float32)   # 4 MiB, far over the limit
    with pytest.raises(Exception) as info:
        identity(client, x)
    assert info.value.status() == "400"
    assert "exceeds the maximum allowed input size of 65536 bytes" in info.value.message()
    small = np.arange(1024, dtype=np.float32)
    np.testing.assert_array_equal(identity(client, small), small)


def test_gzip_bomb_over_limit(limited):
    doc = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
    plain = json.dumps(doc).encode()[:-1] + b" " * (LIMIT * 16) + b"}"
    body = gzip.compress(plain)
    assert len(body) < LIMIT
    status, _, data = post(limited, "/v2/models/identity_fp32/infer", body, {"Content-Encoding": "gzip"})
    assert (status, json.loads(data)) == (400, {
        "error": f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {HINT}"})
    small = json.dumps(doc).encode()
    status, _, data = post(limited, "/v2/models/identity_fp32/infer", gzip.compress(small),
                           {"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(data)["outputs"][0]["data"] == [1.0]


def test_unsupported_encoding_on_limited_server(limited):
    status, headers, data = post(limited, "/v2/models/identity_fp32/infer", b"x", {"Content-Encoding": "compress"})
    assert (status, json.loads(data)) == (501, {"error": "Unsupported compression type"})
    assert headers["accept-encoding"] == "gzip, deflate"
    assert httpclient.InferenceServerClient(limited.http_url).is_server_live()


# ------------------------------------------------------------------------- a bad model beside good ones

def bad_models(example_repo: Path, dest: Path) -> Path:
    repo = small_repo(example_repo, dest, ["identity_fp32", "mlp_onnx"])
    broken = repo / "broken_init"
    shutil.copytree(example_repo / "identity_fp32", broken)
    cfg = (broken / "config.pbtxt").read_text().replace('"identity_fp32"', '"broken_init"')
    (broken / "config.pbtxt").write_text(cfg)
    (broken / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('deliberately broken in initialize')\n")
    bad_cfg = repo / "bad_config"
    (bad_cfg / "1").mkdir(parents=True)
    (bad_cfg / "1" / "model.py").write_text((example_repo / "identity_fp32" / "1" / "model.py").read_text())
    (bad_cfg / "config.pbtxt").write_text('name: "bad_config"\nbackend: "python"\nmax_batch_size: nonsense\n')
    return repo


def test_bad_model_served_beside_good_ones(example_repo, tmp_path):
    with serving(TritondServer(bad_models(example_repo, tmp_path / "repo"), ["--exit-on-error=false"]),
                 wait="live") as s:
        client = httpclient.InferenceServerClient(s.http_url)

        def settled() -> dict | None:
            index = {e["name"]: e for e in client.get_model_repository_index()}
            done = len(index) == 4 and all(e.get("state") in ("READY", "UNAVAILABLE") for e in index.values())
            return index if done else None
        index = wait_for(settled, 120, "every model to be READY or UNAVAILABLE")
        assert index["identity_fp32"]["state"] == "READY"
        assert index["mlp_onnx"]["state"] == "READY"
        assert index["broken_init"]["state"] == "UNAVAILABLE"
        assert "deliberately broken in initialize" in index["broken_init"]["reason"]
        assert index["bad_config"]["state"] == "UNAVAILABLE"
        assert "max_batch_size" in index["bad_config"]["reason"]
        assert client.is_server_live()
        assert not client.is_server_ready()     # strict readiness: a model is not READY
        assert http_get(f"http://{s.http_url}/v2/health/ready")[0] == 400
        assert client.is_model_ready("identity_fp32") and not client.is_model_ready("broken_init")
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(identity(client, x), x)
        y = np.zeros((1, 256), np.float32)
        t = httpclient.InferInput("INPUT0", [1, 256], "FP32")
        t.set_data_from_numpy(y)
        assert client.infer("mlp_onnx", [t]).as_numpy("OUTPUT0").shape == (1, 256)
        with pytest.raises(Exception) as info:
            identity(client, x, "broken_init")
        assert info.value.status() in ("400", "404", "503")


def test_bad_model_exits_by_default(example_repo, tmp_path):
    s = TritondServer(bad_models(example_repo, tmp_path / "repo")).start(wait="exit")
    assert s.returncode not in (0, None), s.log
    s.assert_clean()


# ------------------------------------------------------------------------- workers, SIGTERM, hypercorn

def accepted(port: int) -> dict[int, int]:
    """Established connections accepted on `port`: peer port -> socket inode."""
    return {remote: inode for local, remote, inode in tcp_connections() if local == port}


def test_two_http_workers_then_sigterm_with_requests_in_flight(example_repo, tmp_path):
    repo = small_repo(example_repo, tmp_path / "repo", ["identity_fp32"])
    markers = tmp_path / "markers"
    markers.mkdir()
    # 200 ms to gather a batch, as batch_reporter; its markers count the requests it began
    add_fault_model(repo, "slow", batching="max_queue_delay_microseconds: 200000", params={"marker_dir": markers})
    with serving(TritondServer(repo, ["--http-workers", "2"])) as s:
        frontends = s.role_pids("tritond.frontend.http.server")
        assert len(frontends) == 2, frontends
        # New connections are spread over both processes by SO_REUSEPORT; each one that served a
        # request is traced to the process holding it.
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()
        served_by: list[int] = []
        for _ in range(16):
            conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=60)
            conn.request("POST", "/v2/models/identity_fp32/infer", body=body)
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["outputs"][0]["data"] == [1.0]
            inode = accepted(s.http_port)[conn.sock.getsockname()[1]]
            served_by += [pid for pid in frontends if inode in socket_inodes(pid)]
            conn.close()
        assert len(served_by) == 16 and set(served_by) == set(frontends), served_by

        results: list[object] = []
        finished: list[float] = []

        def slow(i: int) -> None:
            c = httpclient.InferenceServerClient(s.http_url, network_timeout=120.0)
            x = np.full((1, 4), i, np.float32)
            t = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            t.set_data_from_numpy(x)
            try:
                r = c.infer("slow", [t], parameters={"sleep_ms": 1500})
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
                finished.append(time.monotonic())
                results.append("ok")
            except BaseException as e:
                results.append(e)

        threads = [threading.Thread(target=slow, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # The frontends have read all four once the model began them or they wait in its queue
        # (begun is read first: a request moving between the two is then counted in neither).
        wait_for(lambda: started(markers) + metric(s, "nv_inference_pending_request_count", 0, model="slow") == 4,
                 60, "the four requests to reach the model", every=0.02)
        signalled = time.monotonic()
        s.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert results == ["ok"] * 4, results
        assert min(finished) > signalled     # they really were in flight when the signal came


def disconnect_mid_request(server: TritondServer) -> None:
    """Send a slow request and hang up once it executes (batch_reporter's batcher holds it
    200 ms; hanging up while it is still queued would take it out), before the answer comes."""
    body = json.dumps({"parameters": {"sleep_ms": 500},
                       "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/batch_reporter/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_for(lambda: metric(server, "tritond_broker_inflight_batches") == 1, 30, "the request to execute", every=0.02)
    sock.close()


def test_hypercorn(example_repo, tmp_path):
    repo = small_repo(example_repo, tmp_path / "repo", ["identity_fp32", "batch_reporter"])
    with serving(TritondServer(repo, ["--http-server", "hypercorn"])) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.is_server_live() and client.is_server_ready()
        x = np.arange(1000, dtype=np.float32)
        np.testing.assert_array_equal(identity(client, x), x)
        status, headers, body = post(s, "/v2/models/nope/infer", b"{}")
        assert (status, json.loads(body)) == (400, {"error": "Request for unknown model: 'nope' is not found"})
        assert headers["server"].startswith("hypercorn")
        disconnect_mid_request(s)
        wait_for(lambda: client.get_inference_statistics("batch_reporter")["model_stats"][0]["inference_stats"]
                 ["success"]["count"] == 1, 60, "the abandoned request to run to completion")
        np.testing.assert_array_equal(identity(client, x), x)
