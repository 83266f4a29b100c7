"""KServe v2 load for HTTP and gRPC: request building, connections, and the Driver that keeps
a closed loop of N requests (or an open-loop request rate) on a server. `tritond perf`
measures with engine.py on top of it; the benchmarks in perf/ use `run`, one warm-up and one
measured window where only completions inside the window count.

Requests are serialized once up front so the client spends little CPU per request, which
matters when client and server share a few cores.

HTTP uses a minimal asyncio-streams HTTP/1.1 client with one keep-alive connection per
worker: aiohttp was measured at ~260 ms per 4 MiB POST where a plain socket needs ~10 ms.
gRPC sends pre-serialized ModelInferRequest bytes through a generic grpc.aio unary call
spread over a few channels, so one HTTP/2 connection does not become the bottleneck.
With `ClientTls` both protocols connect over TLS (mutual TLS with a client certificate); each
HTTP connection and each gRPC channel does one handshake, then stays open.
"""
from __future__ import annotations

import asyncio
import json
import random
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

T = TypeVar("T")

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.use_local_subchannel_pool", 1),
]
MAX_GRPC_CHANNELS = 4
ERROR_BACKOFF_S = 0.01
DELAY_TOLERANCE_NS = 1_000_000       # a rate-mode request sent over 1 ms late counts as delayed
MAX_IN_FLIGHT = 4096                 # rate mode: beyond this, sends wait for a slot (and are delayed)
STOP_GRACE_S = 30.0

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
class ClientTls:
    """TLS for the load: the CA that signed the server's certificate, and optionally the
    client certificate and key that mutual TLS asks for (PEM files)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def grpc_credentials(self):
        import grpc

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


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

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None):
        self.host, self.port, self.ssl_context = host, port, ssl_context
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.send_ns = 0   # of the last request: writing it out
        self.recv_ns = 0   # of the last request: reading the response after its head arrived

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Return (status, body); reconnects lazily after the server closed the connection."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=1 << 24,
                                                          ssl=self.ssl_context)
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


class Driver:
    """Keeps load on the server (a closed loop of N requests, or an open-loop schedule) and
    records every completed request; `take()` hands over what completed since the last call."""

    def __init__(self, url: str, protocol: str, requests: Sequence[bytes], timeout: float = STOP_GRACE_S,
                 tls: ClientTls | None = None) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self.url, self.protocol, self.requests = url, protocol, list(requests)
        self.tls = tls
        self._ssl_context = tls.ssl_context() if tls and protocol == "http" else None
        self.timeout = timeout
        self.samples: list[tuple[int, int, int, int]] = []
        self.errors = 0
        self.delayed = 0
        self.last_error = ""
        self._next = 0
        self._running = False
        self._tasks: set[asyncio.Task] = set()
        self._idle_http: list[HttpConnection] = []
        self._all_http: list[HttpConnection] = []
        self._channels: list = []
        self._calls: list = []
        self._rpc_error: type[Exception] = Exception
        self._slots: asyncio.Semaphore | None = None

    # ---------------------------------------------------------------- sending

    def _request(self) -> bytes:
        req = self.requests[self._next % len(self.requests)]
        self._next += 1
        return req

    def _open_grpc(self) -> None:
        import grpc

        if self._calls or self.protocol != "grpc":
            return
        self._rpc_error = grpc.RpcError
        host, port = split_target(self.url)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.tls is None:
            self._channels = [grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
                              for _ in range(MAX_GRPC_CHANNELS)]
        else:
            credentials = self.tls.grpc_credentials()
            self._channels = [grpc.aio.secure_channel(address, credentials, options=GRPC_OPTIONS)
                              for _ in range(MAX_GRPC_CHANNELS)]
        self._calls = [ch.unary_unary(MODEL_INFER) for ch in self._channels]

    async def _send_http(self, request: bytes) -> tuple[int, int]:
        conn = self._idle_http.pop() if self._idle_http else None
        if conn is None:
            conn = HttpConnection(*split_target(self.url), self._ssl_context)
            self._all_http.append(conn)
        try:
            status, body = await conn.send(request)
        finally:
            self._idle_http.append(conn)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        return conn.send_ns, conn.recv_ns

    async def _send_grpc(self, request: bytes) -> tuple[int, int]:
        call = self._calls[self._next % len(self._calls)]
        try:
            await call(request, timeout=self.timeout)
        except self._rpc_error as exc:
            raise RuntimeError(f"gRPC {exc.code().name}: {exc.details()}") from None
        return 0, 0

    async def send_one(self) -> tuple[int, int]:
        """One request, outside any measurement: the probe that fails fast on a wrong model."""
        self._open_grpc()
        return await (self._send_http if self.protocol == "http" else self._send_grpc)(self._request())

    async def _one(self, delayed: bool = False) -> bool:
        send = self._send_http if self.protocol == "http" else self._send_grpc
        request = self._request()
        start = time.perf_counter_ns()
        try:
            send_ns, recv_ns = await send(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed request is counted; the load goes on
            self.errors += 1
            self.last_error = str(exc)
            return False
        end = time.perf_counter_ns()
        self.samples.append((end, end - start, send_ns, recv_ns))
        if delayed:
            self.delayed += 1
        return True

    async def _closed_worker(self) -> None:
        while self._running:
            if not await self._one():
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def _open_loop(self, rate: float, poisson: bool) -> None:
        rng = random.Random(0)
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        next_ns = time.perf_counter_ns()

        async def fire(delayed: bool) -> None:
            try:
                await self._one(delayed)
            finally:
                self._slots.release()

        while self._running:
            now = time.perf_counter_ns()
            while next_ns <= now and self._running:
                await self._slots.acquire()
                late = time.perf_counter_ns() - next_ns > DELAY_TOLERANCE_NS
                task = asyncio.ensure_future(fire(late))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                gap = rng.expovariate(rate) if poisson else 1.0 / rate
                next_ns += int(gap * 1e9)
            await asyncio.sleep(max(next_ns - time.perf_counter_ns(), 0) / 1e9)

    # ---------------------------------------------------------------- control

    async def start(self, concurrency: int = 0, rate: float = 0.0, poisson: bool = False) -> None:
        """Start a closed loop of `concurrency` requests, or an open loop at `rate` per second."""
        self._open_grpc()
        self._running = True
        if concurrency > 0:
            coros = [self._closed_worker() for _ in range(concurrency)]
        elif rate > 0:
            coros = [self._open_loop(rate, poisson)]
        else:
            raise ValueError("need a concurrency >= 1 or a request rate > 0")
        for coro in coros:
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def take(self) -> tuple[list[tuple[int, int, int, int]], int, int]:
        """(samples, errors, delayed) since the last call."""
        out = (self.samples, self.errors, self.delayed)
        self.samples, self.errors, self.delayed = [], 0, 0
        return out

    async def stop(self) -> None:
        """Stop sending; requests in flight get `timeout` seconds to finish, then are cancelled."""
        self._running = False
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._tasks.clear()

    async def close(self) -> None:
        await self.stop()
        for conn in self._all_http:
            conn.close()
        self._all_http.clear()
        self._idle_http.clear()
        for ch in self._channels:
            await ch.close()
        self._channels, self._calls = [], []


Sender = Callable[[], Awaitable[None]]


async def closed_loop(senders: Sequence[Sender], warmup: float, duration: float, grace: float = STOP_GRACE_S) -> Result:
    """A closed loop over custom send coroutines (one per client; e.g. a request that changes
    every time): warm-up, then a measured window where only completions inside it count."""
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
    tls: ClientTls | None = None,
) -> Result:
    """Measure one concurrency level. One probe request goes first so a wrong model name or
    a dead server raises LoadgenError instead of producing a table of errors. `binary`
    selects the HTTP binary tensor extension; `grace` bounds how long a request may
    outlive the window before it is abandoned; `tls` connects over TLS."""
    if concurrency < 1 or duration <= 0 or warmup < 0:
        raise ValueError("need concurrency >= 1, duration > 0 and warmup >= 0")
    if protocol == "http":
        request = http_request(*split_target(target), model, inputs, binary)
    elif protocol == "grpc":
        request = grpc_request(model, inputs)
    else:
        raise ValueError(f"unknown protocol {protocol!r}")
    driver = Driver(target, protocol, [request], timeout=grace, tls=tls)
    try:
        try:
            await driver.send_one()
        except Exception as exc:
            raise LoadgenError(f"probe request to {target} failed: {exc}") from exc
        await driver.start(concurrency=concurrency)
        await asyncio.sleep(warmup)
        driver.take()
        start = time.perf_counter_ns()
        await asyncio.sleep(duration)
        samples, errors, _ = driver.take()
        end = time.perf_counter_ns()
    finally:
        await driver.close()
    latencies = [s[1] / 1e6 for s in samples if start <= s[0] <= end]
    ms = np.array(latencies) if latencies else np.array([np.nan])
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return Result(len(latencies) / duration, p50, p90, p99, len(latencies), errors)


def run(
    target: str,
    protocol: str,
    model: str,
    inputs: Sequence[Input],
    concurrency: int,
    duration: float,
    warmup: float = 1.0,
    binary: bool = False,
    tls: ClientTls | None = None,
) -> Result:
    """Blocking wrapper around run_async."""
    return run_blocking(run_async(target, protocol, model, inputs, concurrency, duration, warmup, binary, tls=tls))


def run_blocking(coro: Awaitable[T]) -> T:
    """Run `coro` on a new event loop: uvloop when it is installed (a cheaper client)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
