"""The raw infer route over uvicorn's real httptools protocol (with tritond's limits) and a
broker client that answers at once: what goes on the wire is what uvicorn's send() writes
for the same response, one write per response, and the framework's paths (errors, other
servers) answer as before."""
from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from tritond.frontend.broker_client import ModelTable
from tritond.frontend.dataplane import Dataplane
from tritond.frontend.http.app import HttpApi, HttpOptions
from tritond.frontend.http.limits import ConnectionCap, HttpLimits, uvicorn_protocol
from tritond.wire import schema as S
from tritond.wire.options import HttpLimitsConfig

DATE = b"Wed, 02 Dec 2026 06:35:04 GMT"


class Client:
    """The broker client's surface the route uses; the "model" echoes its input."""

    def __init__(self) -> None:
        view = S.ModelView(inputs={"INPUT0": S.TensorView("INPUT0", "FP32", [-1])},
                           outputs={"OUTPUT0": S.TensorView("OUTPUT0", "FP32", [-1])})
        entry = S.ModelEntry("identity", 1, S.ModelState.READY, view=view, config={})
        self.table = ModelTable(S.Table(1, [entry], ["identity"], True))
        self.tracing: dict[str, str] = {}
        self.ids = itertools.count(1)
        self.sent: list[S.Infer] = []

    def trace_mode(self, model: str) -> str:
        return ""

    def next_id(self, model: str = "") -> int:
        return next(self.ids)

    async def infer(self, msg: S.Infer, on_orphan=None) -> S.InferReply:
        self.sent.append(msg)
        d = msg.inputs[0]
        return S.InferReply(msg.rid, 1, [S.TensorDesc("OUTPUT0", d.datatype, d.shape, d.loc)])

    def release_outputs(self, reply: S.InferReply) -> None:
        pass


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.closed_by_server = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts) -> None:
        self.writes.append(b"".join(bytes(p) for p in parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request(body: bytes, path: str = "/v2/models/identity/infer", extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n"
            % (path.encode(), extra, len(body))) + body


def infer_body(values: list[float], **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32",
                                   "data": values}], **extra}).encode()


async def serve(data: bytes | list[bytes], opts: HttpOptions | None = None, responses: int = 1,
                client: Client | None = None) -> Transport:
    """Feed `data` (or its parts, a loop turn apart) to one connection; returns its transport
    once `responses` were written."""
    api = HttpApi(Dataplane(client or Client(), None, None), opts or HttpOptions())
    limits = HttpLimits.from_options(HttpLimitsConfig())
    protocol_class = uvicorn_protocol(HttpToolsProtocol, limits, ConnectionCap(limits, "test"))
    config = uvicorn.Config(api.app(), http=protocol_class, loop="none", lifespan="off", access_log=False,
                            log_level="warning", proxy_headers=False)
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", DATE), *config.encoded_headers]
    protocol = protocol_class(config=config, server_state=state, app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    for part in [data] if isinstance(data, bytes) else data:
        protocol.data_received(part)
        await asyncio.sleep(0)
    for _ in range(200):
        if sum(w.startswith(b"HTTP/1.1 ") for w in transport.writes) >= responses:
            break
        await asyncio.sleep(0)
    for _ in range(10):         # a response written in parts (the framework's) completes
        await asyncio.sleep(0)
    transport.closed_by_server = transport.closed
    protocol.connection_lost(None)
    return transport


def split(raw: bytes) -> tuple[list[bytes], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), body


def first(transport: Transport) -> tuple[list[bytes], bytes]:
    """The head lines and body of the first response, however many writes it took."""
    return split(b"".join(transport.writes))


def test_a_json_response_is_one_write_in_uvicorns_layout():
    transport = asyncio.run(serve(request(infer_body([1.0, 2.5]))))
    assert len(transport.writes) == 1
    lines, body = split(transport.writes[0])
    assert lines == [b"HTTP/1.1 200 OK", b"date: " + DATE, b"server: uvicorn",
                     b"content-length: %d" % len(body), b"content-type: application/json"]
    assert json.loads(body) == {"model_name": "identity", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.5]}]}
    assert not transport.closed_by_server


def test_binary_output_and_compression_headers():
    body = infer_body([1.0, 2.0], parameters={"binary_data_output": True})
    transport = asyncio.run(serve(request(body, extra=b"Accept-Encoding: gzip\r\n")))
    lines, payload = split(transport.writes[0])
    assert lines[:3] == [b"HTTP/1.1 200 OK", b"date: " + DATE, b"server: uvicorn"]
    assert lines[3].startswith(b"inference-header-content-length: ")
    assert lines[4:] == [b"content-encoding: gzip", b"content-length: %d" % len(payload),
                         b"content-type: application/octet-stream"]
    import gzip
    plain = gzip.decompress(payload)
    json_len = int(lines[3].split(b": ")[1])
    assert np.frombuffer(plain[json_len:], np.float32).tolist() == [1.0, 2.0]


def test_connection_close_is_said_and_done():
    transport = asyncio.run(serve(request(infer_body([1.0]), extra=b"Connection: close\r\n")))
    lines, _ = split(transport.writes[0])
    assert lines[-1] == b"connection: close"
    assert transport.closed_by_server


def test_pipelined_requests_are_answered_in_order():
    data = request(infer_body([1.0]), extra=b"X-A: 1\r\n") + request(infer_body([2.0, 3.0]))
    transport = asyncio.run(serve(data, responses=2))
    bodies = [json.loads(split(w)[1]) for w in transport.writes]
    assert [b["outputs"][0]["data"] for b in bodies] == [[1.0], [2.0, 3.0]]


def test_a_body_still_arriving_is_read_through_receive():
    data = request(infer_body([1.0, 2.0, 3.0]))
    transport = asyncio.run(serve([data[:-7], data[-7:]]))
    assert json.loads(split(transport.writes[0])[1])["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_a_client_that_expects_100_continue_gets_it_before_the_response():
    transport = asyncio.run(serve(request(infer_body([4.0]), extra=b"Expect: 100-continue\r\n")))
    assert transport.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert json.loads(split(transport.writes[1])[1])["outputs"][0]["data"] == [4.0]


def test_a_held_body_over_the_limit_is_refused_as_one_that_is_read():
    body = infer_body([1.0] * 64)
    transport = asyncio.run(serve(request(body), HttpOptions(max_input_size=100)))
    lines, payload = first(transport)
    assert lines[0] == b"HTTP/1.1 400 Bad Request"
    assert json.loads(payload)["error"].startswith(f"request JSON size of {len(body)} bytes exceeds")


def test_request_parameters_reach_the_broker_checked_once():
    client = Client()
    body = infer_body([1.0], id="r1", parameters={"priority": 2, "sequence_id": "abc", "sequence_start": True,
                                                  "custom": 7, "huge": 1 << 70})
    asyncio.run(serve(request(body), client=client))
    msg = client.sent[0]
    assert (msg.id, msg.priority, msg.correlation_id, msg.flags) == ("r1", 2, "abc", 1)
    assert msg.params == {"custom": 7, "huge": float(1 << 70)}


@pytest.mark.parametrize("parameters, status, message", [
    ({"priority": -1}, 400, "Unable to parse 'priority'"),
    ({"triton_x": 1}, 400, "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                           "not be specified."),
    ({"sequence_id": "x" * 129}, 501, "string correlation ID cannot be longer than 128 characters"),
    ({"sequence_id": "x" * 129, "bad": [1]}, 400, "parameter 'bad' has invalid type. It should be either "
                                                  "'int', 'bool', or 'string'."),
])
def test_parameter_errors(parameters, status, message):
    transport = asyncio.run(serve(request(infer_body([1.0], parameters=parameters))))
    lines, body = first(transport)
    assert lines[0].startswith(b"HTTP/1.1 %d " % status)
    assert json.loads(body) == {"error": message}


def test_errors_take_the_framework_path():
    transport = asyncio.run(serve(request(infer_body([1.0]), path="/v2/models/nope/infer")))
    lines, body = first(transport)
    assert lines[0] == b"HTTP/1.1 400 Bad Request"
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}


def test_restricted_inference():
    opts = HttpOptions(restricted={"inference": ("Infer-Key", "secret")})
    refused = asyncio.run(serve(request(infer_body([1.0]), extra=b"infer-key: wrong\r\n"), opts))
    lines, body = first(refused)
    assert lines[0] == b"HTTP/1.1 403 Forbidden"
    assert json.loads(body) == {"error": "This API is restricted, expecting header 'infer-key'"}
    admitted = asyncio.run(serve(request(infer_body([1.0]), extra=b"Infer-Key: secret\r\n"), opts))
    assert split(admitted.writes[0])[0][0] == b"HTTP/1.1 200 OK"


def test_without_uvicorn_the_response_goes_through_asgi_send():
    api = HttpApi(Dataplane(Client(), None, None), HttpOptions())
    body = infer_body([4.0])
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/identity/versions/1/infer",
             "headers": [(b"content-length", str(len(body)).encode())], "query_string": b"", "root_path": ""}
    asyncio.run(api.app()(scope, receive, send))
    assert sent[0] == {"type": "http.response.start", "status": 200, "headers": [
        (b"content-length", str(len(sent[1]["body"])).encode()), (b"content-type", b"application/json")]}
    assert json.loads(sent[1]["body"])["outputs"][0]["data"] == [4.0]
