"""KServe v2 request building and sending for HTTP and gRPC, and the closed-loop load
generator the benchmarks in perf/ share (`tritond perf` measures with engine.py on top).

N workers each send a request, wait for the whole response and send the next one, for
warm-up seconds and then a measured window; only completions inside the window count.
Requests are serialized once up front so the client spends little CPU per request, which
matters when client and server share a few cores.

HTTP uses a minimal asyncio-streams HTTP/1.1 client with one keep-alive connection per
worker: aiohttp was measured at ~260 ms per 4 MiB POST where a plain socket needs ~10 ms.
gRPC sends pre-serialized ModelInferRequest bytes through a generic grpc.aio unary call
spread over a few channels, so one HTTP/2 connection does not become the bottleneck.
"""
from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.use_local_subchannel_pool", 1),
]
MAX_GRPC_CHANNELS = 4
ERROR_BACKOFF_S = 0.01

Sender = Callable[[], Awaitable[None]]
Closer = Callable[[], Awaitable[None]]

NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


class LoadgenError(RuntimeError):
    """The server rejected the probe request, so measuring it would only count errors."""


class RequestFailed(RuntimeError):
    """The server answered with an error; the measuring loop counts it and goes on."""


@dataclass(frozen=True)
class Input:
    """One named input tensor; data is a numpy array of the KServe datatype."""

    name: str
    datatype: str
    data: np.ndarray


@dataclass(frozen=True)
class Result:
    """One concurrency level; latencies come only from completions inside the window."""

    infer_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    count: int
    errors: int


def make_input(name: str, shape: Sequence[int], datatype: str, seed: int = 0) -> Input:
    """Deterministic random data of the given shape and KServe datatype."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if datatype == "BYTES":
        data = np.array([f"item-{i}".encode() for i in rng.integers(0, 1000, size)], dtype=np.object_)
    elif datatype == "BOOL":
        data = rng.integers(0, 2, size).astype(np.bool_)
    elif datatype.startswith(("INT", "UINT")):
        data = rng.integers(0, 100, size).astype(NUMPY_DTYPES[datatype])
    else:
        data = rng.standard_normal(size).astype(NUMPY_DTYPES[datatype])
    return Input(name, datatype, data.reshape(shape))


def raw_bytes(inp: Input) -> bytes:
    """Tensor bytes as the binary extension and gRPC raw_input_contents expect them."""
    if inp.datatype == "BYTES":
        items = [x if isinstance(x, bytes) else str(x).encode() for x in inp.data.ravel()]
        return b"".join(struct.pack("<I", len(x)) + x for x in items)
    return np.ascontiguousarray(inp.data, dtype=np.dtype(NUMPY_DTYPES[inp.datatype]).newbyteorder("<")).tobytes()


def _json_data(inp: Input) -> list:
    if inp.datatype == "BYTES":
        return [x.decode() if isinstance(x, bytes) else str(x) for x in inp.data.ravel()]
    return inp.data.ravel().tolist()


@dataclass(frozen=True)
class ShmRef:
    """Where a tensor lies in a registered system shared-memory region."""

    region: str
    byte_size: int
    offset: int = 0

    def params(self) -> dict:
        return {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size,
                "shared_memory_offset": self.offset}


def http_request(host: str, port: int, model: str, inputs: Sequence[Input], binary: bool, *,
                 version: str = "", input_shm: dict[str, ShmRef] | None = None,
                 output_shm: dict[str, ShmRef] | None = None) -> bytes:
    """A complete HTTP/1.1 infer request (head and body): JSON or binary tensor extension, or
    tensors named by shared-memory region (`input_shm`, `output_shm`) with no data in the body."""
    headers = {"Host": f"{host}:{port}"}
    tensors = [{"name": i.name, "shape": list(i.data.shape), "datatype": i.datatype} for i in inputs]
    doc: dict = {"inputs": tensors}
    if output_shm:
        doc["outputs"] = [{"name": name, "parameters": ref.params()} for name, ref in output_shm.items()]
    elif binary:
        doc["parameters"] = {"binary_data_output": True}
    raws: list[bytes] = []
    for tensor, inp in zip(tensors, inputs):
        if input_shm and inp.name in input_shm:
            tensor["parameters"] = input_shm[inp.name].params()
        elif binary:
            raws.append(raw_bytes(inp))
            tensor["parameters"] = {"binary_data_size": len(raws[-1])}
        else:
            tensor["data"] = _json_data(inp)
    head = json.dumps(doc).encode()
    body = head + b"".join(raws)
    if raws:
        headers["Content-Type"] = "application/octet-stream"
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        headers["Content-Type"] = "application/json"
    headers["Content-Length"] = str(len(body))
    path = f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    lines = [f"POST {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def grpc_request(model: str, inputs: Sequence[Input], *, version: str = "",
                 input_shm: dict[str, ShmRef] | None = None, output_shm: dict[str, ShmRef] | None = None) -> bytes:
    """A serialized ModelInferRequest carrying the tensors in raw_input_contents, or naming
    their shared-memory regions."""
    from tritonclient.grpc import service_pb2

    def set_shm(params, ref: ShmRef) -> None:
        params["shared_memory_region"].string_param = ref.region
        params["shared_memory_byte_size"].int64_param = ref.byte_size
        params["shared_memory_offset"].int64_param = ref.offset

    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for inp in inputs:
        tensor = req.inputs.add(name=inp.name, datatype=inp.datatype)
        tensor.shape.extend(inp.data.shape)
        if input_shm and inp.name in input_shm:
            set_shm(tensor.parameters, input_shm[inp.name])
        else:
            req.raw_input_contents.append(raw_bytes(inp))
    for name, ref in (output_shm or {}).items():
        set_shm(req.outputs.add(name=name).parameters, ref)
    return req.SerializeToString()


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that sends a pre-built request and reads the reply."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.send_ns = 0   # of the last request: writing it out
        self.recv_ns = 0   # of the last request: reading the response after its head arrived

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Return (status, body); reconnects lazily after the server closed the connection."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
        reader, writer = self._streams
        try:
            t0 = time.perf_counter_ns()
            writer.write(request)
            await writer.drain()
            self.send_ns = time.perf_counter_ns() - t0
            head = await reader.readuntil(b"\r\n\r\n")
            t1 = time.perf_counter_ns()
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in header_lines:
                key, sep, value = line.partition(":")
                if sep:
                    headers[key.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await self._read_chunked(reader)
            else:
                body = await reader.readexactly(int(headers.get("content-length", 0)))
            self.recv_ns = time.perf_counter_ns() - t1
            if headers.get("connection", "").lower() == "close":
                self.close()
        except BaseException:
            self.close()
            raise
        return int(status_line.split()[1]), body

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


def split_target(target: str) -> tuple[str, int]:
    """'host:port' (also 'http://host:port' or '[::1]:port') -> (host, port)."""
    target = target.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


async def _measure(senders: Sequence[Sender], warmup: float, duration: float, grace: float) -> Result:
    start = time.perf_counter()
    window_start, window_end = start + warmup, start + warmup + duration
    latencies: list[float] = []
    errors = 0

    async def worker(send: Sender) -> None:
        nonlocal errors
        while (begin := time.perf_counter()) < window_end:
            try:
                await send()
            except Exception:  # any failed request is an error; keep loading until time is up
                errors += 1
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            end = time.perf_counter()
            if window_start <= end <= window_end:
                latencies.append(end - begin)

    tasks = [asyncio.ensure_future(worker(s)) for s in senders]
    _, pending = await asyncio.wait(tasks, timeout=warmup + duration + grace)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors += len(pending)
    ms = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return Result(len(latencies) / duration, p50, p90, p99, len(latencies), errors)


def _http_senders(
    target: str, model: str, inputs: Sequence[Input], concurrency: int, binary: bool
) -> tuple[list[Sender], Closer]:
    host, port = split_target(target)
    request = http_request(host, port, model, inputs, binary)
    conns = [HttpConnection(host, port) for _ in range(concurrency)]

    def sender(conn: HttpConnection) -> Sender:
        async def send() -> None:
            status, body = await conn.send(request)
            if status != 200:
                raise RequestFailed(f"HTTP {status}: {body[:300].decode(errors='replace')}")

        return send

    async def close() -> None:
        for conn in conns:
            conn.close()

    return [sender(c) for c in conns], close


def _grpc_senders(
    target: str, model: str, inputs: Sequence[Input], concurrency: int, timeout: float
) -> tuple[list[Sender], Closer]:
    import grpc

    request = grpc_request(model, inputs)
    host, port = split_target(target)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    n_channels = min(MAX_GRPC_CHANNELS, concurrency)
    channels = [grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) for _ in range(n_channels)]
    calls = [ch.unary_unary(MODEL_INFER) for ch in channels]

    def sender(call: grpc.aio.UnaryUnaryMultiCallable) -> Sender:
        async def send() -> None:
            try:
                await call(request, timeout=timeout)
            except grpc.RpcError as exc:
                raise RequestFailed(f"gRPC {exc.code().name}: {exc.details()}") from exc

        return send

    async def close() -> None:
        for ch in channels:
            await ch.close()

    return [sender(calls[i % n_channels]) for i in range(concurrency)], close


async def run_async(
    target: str,
    protocol: str,
    model: str,
    inputs: Sequence[Input],
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
    binary: bool = False,
    grace: float = 30.0,
) -> Result:
    """Measure one concurrency level. One probe request goes first so a wrong model name or
    a dead server raises LoadgenError instead of producing a table of errors. `binary`
    selects the HTTP binary tensor extension; `grace` bounds how long a request may
    outlive the window before it is abandoned and counted as an error."""
    if concurrency < 1 or duration <= 0 or warmup < 0:
        raise ValueError("need concurrency >= 1, duration > 0 and warmup >= 0")
    if protocol == "http":
        senders, close = _http_senders(target, model, inputs, concurrency, binary)
    elif protocol == "grpc":
        senders, close = _grpc_senders(target, model, inputs, concurrency, grace)
    else:
        raise ValueError(f"unknown protocol {protocol!r}")
    try:
        try:
            await senders[0]()
        except Exception as exc:
            raise LoadgenError(f"probe request to {target} failed: {exc}") from exc
        return await _measure(senders, warmup, duration, grace)
    finally:
        await close()


def run(
    target: str,
    protocol: str,
    model: str,
    inputs: Sequence[Input],
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
    binary: bool = False,
) -> Result:
    """Blocking wrapper around run_async, on uvloop when it is installed (cheaper client)."""
    coro = run_async(target, protocol, model, inputs, concurrency, duration, warmup, binary)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
