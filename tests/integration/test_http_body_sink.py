"""A large binary infer body is written into the HTTP frontend's arena as it arrives, and the
model reads its tensor there: whole, in pieces, or through the old path (chunked or compressed);
a body shorter or longer than its head says, a binary size that disagrees with the shape and a
client that leaves mid-body are answered as before, and leave no block behind in the arena
(the same request lands where it landed before) and nothing in /dev/shm."""
from __future__ import annotations

import asyncio
import os
import re
import socket
import time

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from conftest import TritondServer, serving, wait_for

N = 1 << 16             # FP32 values: a 256 KiB tensor, above the sink's threshold

PLACE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def place_of(address):
    """(the file mapped at `address`, the offset in it)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return (parts[5] if len(parts) > 5 else ""), int(parts[2], 16) + address - lo
    return "", -1


class TritonPythonModel:
    """OUTPUT0 = INPUT0; WHERE and OFFSET: where the model found INPUT0."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            where, offset = place_of(x.ctypes.data)
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("WHERE", np.array([where.encode()], dtype=object)),
                pb_utils.Tensor("OFFSET", np.array([offset], dtype=np.int64))]))
        return out
'''

PLACE_CONFIG = '''
name: "place"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "OFFSET" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sink") / "models"
    (repo / "place" / "1").mkdir(parents=True)
    (repo / "place" / "config.pbtxt").write_text(PLACE_CONFIG)
    (repo / "place" / "1" / "model.py").write_text(PLACE_MODEL)
    with serving(TritondServer(repo, ["--http-body-timeout-secs=1", "--allow-metrics=false"])) as s:
        yield s


def values(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n).astype(np.float32)


def infer(s: TritondServer, x: np.ndarray, **kwargs) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}")
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        return client.infer("place", [inp], **kwargs)
    finally:
        client.close()


def place(s: TritondServer) -> tuple[str, int]:
    """Where the model finds the same 256 KiB input, sent whole: with nothing left allocated
    in the arena, always the same place."""
    result = infer(s, values())
    return result.as_numpy("WHERE")[0].decode(), int(result.as_numpy("OFFSET")[0])


def frontend_segment(s: TritondServer, where: str) -> bool:
    return any(f"/dev/shm/tritond.{s.server_id}.f{pid}." in where for pid in s.role_pids("tritond.frontend.http"))


def raw_request(x: np.ndarray, header_extra: dict | None = None, size: int | None = None) -> tuple[bytes, bytes]:
    """(head, body) of a binary infer request for INPUT0 = x, as tritonclient writes it;
    `size` overrides the binary_data_size the JSON declares."""
    data = x.tobytes()
    doc = {"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32",
                       "parameters": {"binary_data_size": len(data) if size is None else size}}],
           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}], **(header_extra or {})}
    json = orjson.dumps(doc)
    body = json + data
    head = (f"POST /v2/models/place/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(json)}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


class Responses:
    """The responses that arrive on one connection, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""
        sock.settimeout(30)

    def _more(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.data += chunk
        return bool(chunk)

    def next(self) -> tuple[int | None, dict, bytes]:
        """(status, headers, body), None as the status when the server closed first."""
        while b"\r\n\r\n" not in self.data:
            if not self._more():
                return None, {}, b""
        head, self.data = self.data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(self.data) < length and self._more():
            pass
        body, self.data = self.data[:length], self.data[length:]
        return int(lines[0].split(" ")[1]), headers, body


def response(sock: socket.socket) -> tuple[int | None, dict, bytes]:
    """The one response a connection gets."""
    return Responses(sock).next()


def output_of(headers: dict, body: bytes) -> np.ndarray:
    json_len = int(headers["inference-header-content-length"])
    return np.frombuffer(body[json_len:], np.float32)


def connect(s: TritondServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.http_port), timeout=30)


def test_the_model_reads_the_input_where_the_body_landed(server):
    x = values(seed=1)
    result = infer(server, x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    where = result.as_numpy("WHERE")[0].decode()
    assert frontend_segment(server, where), where
    assert int(result.as_numpy("OFFSET")[0]) % 64 == 0     # the binary part starts aligned


def test_aio_clients_and_several_inputs_at_once(server):
    async def main() -> None:
        client = aiohttpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        try:
            xs = [values(N + 16 * i, seed=i) for i in range(8)]
            inputs = []
            for x in xs:
                inp = aiohttpclient.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                inputs.append(inp)
            results = await asyncio.gather(*[client.infer("place", [inp]) for inp in inputs])
            for x, r in zip(xs, results):
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
        finally:
            await client.close()
    asyncio.run(main())


def test_a_body_in_small_pieces_and_a_next_request_behind_it(server):
    """The head alone, then the body a few KiB at a time, the last piece followed by the next
    request on the same connection."""
    x, y = values(seed=2), values(N // 2 + 3, seed=3)
    head, body = raw_request(x)
    head2, body2 = raw_request(y)
    with connect(server) as sock:
        sock.sendall(head)
        pieces = [body[i:i + 5000] for i in range(0, len(body), 5000)]
        for piece in pieces[:-1]:
            sock.sendall(piece)
            time.sleep(0.001)
        sock.sendall(pieces[-1] + head2 + body2[:100])
        sock.sendall(body2[100:])
        responses = Responses(sock)
        status, headers, out = responses.next()
        assert status == 200
        np.testing.assert_array_equal(output_of(headers, out), x)
        status, headers, out = responses.next()
        assert status == 200
        np.testing.assert_array_equal(output_of(headers, out), y)


def test_chunked_and_compressed_bodies_take_the_asgi_path(server):
    x = values(seed=4)
    for algorithm in ("gzip", "deflate"):
        result = infer(server, x, request_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    head, body = raw_request(x)
    head = head.replace(b"Content-Length: %d\r\n" % len(body), b"Transfer-Encoding: chunked\r\n")
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(body[i:i + 30000]), body[i:i + 30000])
                      for i in range(0, len(body), 30000))
    with connect(server) as sock:
        sock.sendall(head + chunks + b"0\r\n\r\n")
        status, headers, out = response(sock)
    assert status == 200
    np.testing.assert_array_equal(output_of(headers, out), x)


def test_a_client_that_leaves_mid_body_leaves_nothing_allocated(server):
    before = place(server)
    head, body = raw_request(values(seed=5))
    for sent in (0, 1000, len(body) // 2, len(body) - 1):
        with connect(server) as sock:
            sock.sendall(head + body[:sent])
            time.sleep(0.05)
    assert wait_for(lambda: place(server) == before, what="the arena to be as it was")


def test_a_body_shorter_than_its_length_times_out(server):
    before = place(server)
    head, body = raw_request(values(seed=6))
    with connect(server) as sock:
        sock.sendall(head + body[:-10])
        status, _, out = response(sock)
    assert status == 408 and b"request body not received" in out
    assert wait_for(lambda: place(server) == before, what="the arena to be as it was")


def test_bytes_beyond_the_length_are_a_bad_next_request(server):
    """They are parsed as the next request: its 400 may go out before the first one's answer,
    which then never comes (the connection closes)."""
    before = place(server)
    x = values(seed=7)
    head, body = raw_request(x)
    with connect(server) as sock:
        sock.sendall(head + body + b"garbage that is no request\r\n\r\n")
        answers = []
        responses = Responses(sock)
        while True:
            status, headers, out = responses.next()
            if status is None:
                break
            answers.append(status)
            if status == 200:
                np.testing.assert_array_equal(output_of(headers, out), x)
    assert answers[-1] == 400 and set(answers) <= {200, 400}, answers
    assert wait_for(lambda: place(server) == before, what="the arena to be as it was")


@pytest.mark.parametrize("size, message", [
    (N * 4 - 4, b"unexpected additional input data for model 'place'"),
    (N * 4 + 4, b"unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'place'"),
])
def test_a_binary_size_that_disagrees_with_the_body(server, size, message):
    before = place(server)
    head, body = raw_request(values(seed=8), size=size)
    with connect(server) as sock:
        sock.sendall(head + body)
        status, _, out = response(sock)
    assert status == 400 and message in out, out
    assert place(server) == before


def test_a_shape_that_disagrees_with_the_binary_size(server):
    before = place(server)
    x = values(seed=9)
    head, body = raw_request(x)
    json_len = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    json = body[:json_len].replace(b'"shape":[%d]' % N, b'"shape":[%d]' % (N - 1))
    head = head.replace(b"Inference-Header-Content-Length: %d" % json_len,
                        b"Inference-Header-Content-Length: %d" % len(json))
    head = head.replace(b"Content-Length: %d\r\n" % len(body), b"Content-Length: %d\r\n" % (len(json) + 4 * N))
    with connect(server) as sock:
        sock.sendall(head + json + body[json_len:])
        status, _, out = response(sock)
    assert status == 400 and b"input byte size mismatch for input 'INPUT0'" in out, out
    assert place(server) == before


def test_an_inference_header_longer_than_the_body(server):
    head, body = raw_request(values(seed=10))
    json_len = head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0]
    head = head.replace(b"Inference-Header-Content-Length: " + json_len,
                        b"Inference-Header-Content-Length: %d" % (len(body) + 1))
    with connect(server) as sock:
        sock.sendall(head + body)
        status, _, out = response(sock)
    assert status == 400 and b"inference header size should be in range" in out, out


def frontend_shm_bytes(s: TritondServer) -> int:
    """/dev/shm bytes of the HTTP frontend's segments."""
    names = [n for n in s.segments() if any(f".f{pid}." in n for pid in s.role_pids("tritond.frontend.http"))]
    return sum(os.stat(f"/dev/shm/{n}").st_size for n in names)


def test_heads_that_declare_large_bodies_reserve_no_more_than_the_budget(server):
    """Clients that declare 60 MiB bodies and send none: the sinks of the first few hold the
    budget (256 MiB); the others' bodies would take the ASGI path, which holds only what came."""
    before = place(server)
    head, _ = raw_request(values(seed=11))
    head = re.sub(rb"Content-Length: \d+", b"Content-Length: %d" % (60 << 20), head)
    socks = [connect(server) for _ in range(8)]
    try:
        for sock in socks:
            sock.sendall(head)
        assert infer(server, values(seed=12)).as_numpy("OUTPUT0").size == N    # others are served
        assert frontend_shm_bytes(server) <= (256 + 64 + 32) << 20
    finally:
        for sock in socks:
            sock.close()
    assert wait_for(lambda: place(server) == before, what="the arena to be as it was")
