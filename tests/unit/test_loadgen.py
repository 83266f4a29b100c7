"""tritond.perf.loadgen against tiny in-process servers: requests are well formed and counted."""
import asyncio
import json
import struct

import numpy as np
import pytest

from tritond.perf import loadgen


class TinyHttpServer:
    """Keep-alive HTTP/1.1 server that records requests and answers with a fixed status."""

    def __init__(self, status: int = 200, chunked: bool = False):
        self.status, self.chunked = status, chunked
        self.requests: list[tuple[str, dict, bytes]] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
                body = await reader.readexactly(int(headers["content-length"]))
                self.requests.append((request_line, headers, body))
                writer.write(self.response())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def response(self) -> bytes:
        payload = b'{"error":"model not found"}' if self.status != 200 else b'{"outputs":[]}'
        head = f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
        if self.chunked:
            half = len(payload) // 2
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (payload[:half], payload[half:]))
            return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
        return (head + f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload

    async def start(self, ssl_context=None) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=ssl_context)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]


def _fp32_input() -> "loadgen.Input":
    return loadgen.make_input("INPUT0", [16], "FP32")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("chunked", [False, True])
def test_http_results_are_counted(chunked):
    server = TinyHttpServer(chunked=chunked)

    async def scenario():
        target = await server.start()
        async with server.server:
            return await loadgen.run_async(target, "http", "identity_fp32", [_fp32_input()], 4, 0.5, warmup=0.1)

    result = asyncio.run(scenario())
    assert result.errors == 0
    assert result.count > 0
    assert result.infer_per_s == pytest.approx(result.count / 0.5)
    assert 0 < result.p50_ms <= result.p90_ms <= result.p99_ms
    assert server.connections == 4, "one keep-alive connection per worker"
    request_line, headers, body = server.requests[0]
    assert request_line == "POST /v2/models/identity_fp32/infer HTTP/1.1"
    sent = json.loads(body)["inputs"][0]
    assert sent["name"] == "INPUT0" and sent["shape"] == [16] and sent["datatype"] == "FP32"
    np.testing.assert_array_equal(np.array(sent["data"], np.float32), _fp32_input().data)


@pytest.mark.timeout(10)
def test_http_error_status_fails_the_probe():
    server = TinyHttpServer(status=404)

    async def scenario():
        target = await server.start()
        async with server.server:
            await loadgen.run_async(target, "http", "missing", [_fp32_input()], 1, 0.2, warmup=0)

    with pytest.raises(loadgen.LoadgenError, match="HTTP 404.*model not found"):
        asyncio.run(scenario())


def test_http_binary_request_layout():
    inp = loadgen.make_input("INPUT0", [1, 256], "FP32")
    raw = loadgen.http_request("127.0.0.1", 8000, "mlp_onnx", [inp], binary=True)
    head, _, body = raw.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    assert int(headers["Content-Length"]) == len(body)
    json_len = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:json_len])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 256 * 4
    assert header["parameters"]["binary_data_output"] is True
    np.testing.assert_array_equal(np.frombuffer(body[json_len:], np.float32).reshape(1, 256), inp.data)


def test_bytes_tensor_is_length_prefixed():
    inp = loadgen.Input("INPUT0", "BYTES", np.array([b"ab", b""], dtype=np.object_))
    assert loadgen.raw_bytes(inp) == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0)


@pytest.mark.timeout(10)
def test_grpc_results_are_counted():
    import grpc
    from tritonclient.grpc import service_pb2

    received = []

    def model_infer(request: bytes, context) -> bytes:
        received.append(request)
        return service_pb2.ModelInferResponse(model_name="identity_fp32").SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)}
    )

    async def scenario():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await loadgen.run_async(f"127.0.0.1:{port}", "grpc", "identity_fp32", [_fp32_input()], 2, 0.5, 0.1)
        finally:
            await server.stop(None)

    result = asyncio.run(scenario())
    assert result.errors == 0 and result.count > 0
    request = service_pb2.ModelInferRequest.FromString(received[0])
    assert request.model_name == "identity_fp32"
    assert list(request.inputs[0].shape) == [16]
    np.testing.assert_array_equal(np.frombuffer(request.raw_input_contents[0], np.float32), _fp32_input().data)


@pytest.mark.timeout(10)
def test_http_over_mutual_tls(tmp_path):
    import ssl

    from tls_certs import issue, make_ca
    ca = make_ca(tmp_path)
    server_cert = issue(tmp_path, "server", ca, "localhost", server=True)
    client_cert = issue(tmp_path, "client", ca, "client")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert))
    server_ctx.load_cert_chain(str(server_cert.cert), str(server_cert.key))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server = TinyHttpServer()
    tls = loadgen.ClientTls(str(ca.cert), str(client_cert.cert), str(client_cert.key))

    async def scenario():
        target = await server.start(server_ctx)
        async with server.server:
            return await loadgen.run_async(target, "http", "identity_fp32", [_fp32_input()], 2, 0.3, 0.1, tls=tls)

    result = asyncio.run(scenario())
    assert result.errors == 0 and result.count > 0
    assert server.connections == 2
