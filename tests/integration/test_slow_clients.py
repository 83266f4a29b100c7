"""Slow and hostile HTTP clients, on uvicorn and hypercorn alike: an oversized head or too many
header fields get 431, a head or body that does not arrive in time gets 408 (or the connection
closed), an idle keep-alive connection is closed, connections beyond the per-process cap get
503 and a log line; gRPC connections carry at most --grpc-max-concurrent-streams RPCs. The
server serves normally afterwards."""
from __future__ import annotations

import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, http_get, serving, socket_inodes, tcp_connections, wait_for
from fault_models import add_fault_model

CAP = 24
LIMITS = ["--http-max-header-size=8192", "--http-max-headers=50", "--http-header-timeout-secs=1",
          "--http-body-timeout-secs=1", "--http-keepalive-timeout-secs=1", f"--http-max-connections={CAP}",
          "--grpc-max-concurrent-streams=1", "--allow-metrics=false"]


@pytest.fixture(scope="module", params=["uvicorn", "hypercorn"])
def limited(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"slow-{request.param}") / "models"
    add_fault_model(repo, "m", batching=None)
    with serving(TritondServer(repo, [*LIMITS, f"--http-server={request.param}"])) as s:
        s.kind = request.param
        yield s


def connect(s: TritondServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.http_port), timeout=5)


def send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass        # the server cut us off mid-send; its answer is still readable


def answer(sock: socket.socket, within: float = 5.0) -> tuple[int | None, float]:
    """(status of the server's response or None when it closed without one, seconds waited);
    the connection must be closed afterwards."""
    start = time.monotonic()
    sock.settimeout(within)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"the connection was still open after {within} s") from None
    finally:
        sock.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    return status, time.monotonic() - start


def accepted(s: TritondServer) -> int:
    """Connections to the HTTP port that an HTTP frontend has accepted (holds the socket of)."""
    held = set().union(*(socket_inodes(pid) for pid in s.role_pids("tritond.frontend.http")))
    return sum(1 for local, _, inode in tcp_connections() if local == s.http_port and inode in held)


def test_an_oversized_head_is_431(limited):
    sock = connect(limited)
    send(sock, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    assert answer(sock)[0] == 431


def test_too_many_header_fields_are_431(limited):
    sock = connect(limited)
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(200))
    send(sock, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert answer(sock)[0] == 431


def test_half_a_head_is_cut_off(limited):
    sock = connect(limited)
    send(sock, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    status, waited = answer(sock)
    assert status in (408, None) and 0.5 < waited < 4


def test_a_body_that_does_not_arrive_in_time_is_408(limited):
    sock = connect(limited)
    send(sock, b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"{" * 10)
    status, waited = answer(sock)
    assert status == 408 and waited < 4


def test_an_idle_keep_alive_connection_is_closed(limited):
    sock = connect(limited)
    send(sock, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    status, waited = answer(sock)
    assert status is None and waited < 4


def test_connections_beyond_the_cap_get_503_and_a_log_line(limited):
    held = [connect(limited) for _ in range(CAP)]
    try:
        # accepted by the server (within their 1 s header timeout)
        wait_for(lambda: accepted(limited) >= CAP, 1, lambda: f"{CAP} connections accepted, {accepted(limited)} are",
                 every=0.02)
        status, _ = answer(connect(limited))
        assert status == 503
    finally:
        for sock in held:
            sock.close()
    assert f"is at its cap of {CAP} open connections (--http-max-connections)" in limited.log
    wait_for(lambda: http_get(f"http://{limited.http_url}/v2/health/live", 1.0)[0] == 200, 5,
             "live to answer again once the held connections are closed")


def test_the_server_still_serves(limited):
    client = httpclient.InferenceServerClient(limited.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(client.infer("m", [inp]).as_numpy("OUTPUT0"), np.ones((1, 3)))


def test_a_grpc_connection_carries_at_most_max_concurrent_streams(limited):
    if limited.kind != "uvicorn":
        pytest.skip("the gRPC frontend is the same for both HTTP servers")
    release = threading.Event()

    def held_open():
        release.wait(10)
        return
        yield

    with grpc.insecure_channel(limited.grpc_url) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)    # the server's stream limit is known
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(held_open())
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError) as e:
            live(b"", timeout=1)
        assert e.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        release.set()
        assert list(stream) == []
        assert live(b"", timeout=5) == b"\x08\x01"
