#!/usr/bin/env python3
"""Closed-loop KServe v2 load generator for HTTP and gRPC.

N workers each send a request, wait for the whole response and send the next one, for
warm-up seconds and then a measured window; only completions inside the window count.
Requests are serialized once up front so the client spends little CPU per request, which
matters when client and server share a few cores.

HTTP uses a minimal asyncio-streams HTTP/1.1 client with one keep-alive connection per
worker: aiohttp was measured at ~260 ms per 4 MiB POST where a plain socket needs ~10 ms.
gRPC sends pre-serialized ModelInferRequest bytes through a generic grpc.aio unary call
spread over a few channels, so one HTTP/2 connection does not become the bottleneck.

  python perf/loadgen.py --url 127.0.0.1:8000 --protocol http --model identity_fp32 \\
      --shape 16 --datatype FP32 --concurrency 1,8 --duration 5

With --ssl-ca (and --ssl-cert/--ssl-key for a client certificate) both protocols use TLS;
each HTTP worker's connection and each gRPC channel does one handshake, then stays open.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import struct
import sys
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


def http_request(host: str, port: int, model: str, inputs: Sequence[Input], binary: bool) -> bytes:
    """A complete HTTP/1.1 infer request (head and body), JSON or binary tensor extension."""
    headers = {"Host": f"{host}:{port}"}
    tensors = [{"name": i.name, "shape": list(i.data.shape), "datatype": i.datatype} for i in inputs]
    if binary:
        raws = [raw_bytes(i) for i in inputs]
        for tensor, raw in zip(tensors, raws):
            tensor["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps({"inputs": tensors, "parameters": {"binary_data_output": True}}).encode()
        body = head + b"".join(raws)
        headers["Content-Type"] = "application/octet-stream"
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        for tensor, inp in zip(tensors, inputs):
            tensor["data"] = _json_data(inp)
        body = json.dumps({"inputs": tensors}).encode()
        headers["Content-Type"] = "application/json"
    headers["Content-Length"] = str(len(body))
    lines = [f"POST /v2/models/{model}/infer HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def grpc_request(model: str, inputs: Sequence[Input]) -> bytes:
    """A serialized ModelInferRequest carrying the tensors in raw_input_contents."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    for inp in inputs:
        tensor = req.inputs.add(name=inp.name, datatype=inp.datatype)
        tensor.shape.extend(inp.data.shape)
        req.raw_input_contents.append(raw_bytes(inp))
    return req.SerializeToString()


class HttpConnection:
    """One keep-alive HTTP/1.1 connection that sends a pre-built request and reads the reply."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None):
        self.host, self.port, self.ssl_context = host, port, ssl_context
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Return (status, body); reconnects lazily after the server closed the connection."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=1 << 24, ssl=self.ssl_context)
        reader, writer = self._streams
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
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
    target: str, model: str, inputs: Sequence[Input], concurrency: int, binary: bool, tls: ClientTls | None = None
) -> tuple[list[Sender], Closer]:
    host, port = split_target(target)
    request = http_request(host, port, model, inputs, binary)
    ctx = tls.ssl_context() if tls else None
    conns = [HttpConnection(host, port, ctx) for _ in range(concurrency)]

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
    target: str, model: str, inputs: Sequence[Input], concurrency: int, timeout: float, tls: ClientTls | None = None
) -> tuple[list[Sender], Closer]:
    import grpc

    request = grpc_request(model, inputs)
    host, port = split_target(target)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    n_channels = min(MAX_GRPC_CHANNELS, concurrency)
    if tls is None:
        channels = [grpc.aio.insecure_channel(address, options=GRPC_OPTIONS) for _ in range(n_channels)]
    else:
        channels = [grpc.aio.secure_channel(address, tls.grpc_credentials(), options=GRPC_OPTIONS)
                    for _ in range(n_channels)]
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
    tls: ClientTls | None = None,
) -> Result:
    """Measure one concurrency level. One probe request goes first so a wrong model name or
    a dead server raises LoadgenError instead of producing a table of errors. `binary`
    selects the HTTP binary tensor extension; `grace` bounds how long a request may
    outlive the window before it is abandoned and counted as an error; `tls` makes both
    protocols connect over TLS."""
    if concurrency < 1 or duration <= 0 or warmup < 0:
        raise ValueError("need concurrency >= 1, duration > 0 and warmup >= 0")
    if protocol == "http":
        senders, close = _http_senders(target, model, inputs, concurrency, binary, tls)
    elif protocol == "grpc":
        senders, close = _grpc_senders(target, model, inputs, concurrency, grace, tls)
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
    tls: ClientTls | None = None,
) -> Result:
    """Blocking wrapper around run_async, on uvloop when it is installed (cheaper client)."""
    coro = run_async(target, protocol, model, inputs, concurrency, duration, warmup, binary, tls=tls)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def format_table(rows: Sequence[tuple[int, Result]]) -> str:
    lines = ["| conc | infer/s | p50 ms | p90 ms | p99 ms | count | errors |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for conc, r in rows:
        lines.append(
            f"| {conc} | {r.infer_per_s:,.1f} | {r.p50_ms:.3f} | {r.p90_ms:.3f} | {r.p99_ms:.3f} | {r.count} | {r.errors} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="host:port of the server's HTTP or gRPC endpoint")
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--format", choices=["json", "binary"], default="json", help="HTTP body encoding")
    p.add_argument("--model", required=True)
    p.add_argument("--input-name", default="INPUT0", help="comma-separated; each input gets the same shape and datatype")
    p.add_argument("--shape", required=True, help="full request shape, comma-separated, e.g. 16 or 1,256")
    p.add_argument("--datatype", default="FP32", choices=sorted(NUMPY_DTYPES))
    p.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per level")
    p.add_argument("--ssl-ca", help="connect over TLS, trusting this CA certificate (PEM)")
    p.add_argument("--ssl-cert", help="client certificate (PEM) for mutual TLS")
    p.add_argument("--ssl-key", help="client private key (PEM) for mutual TLS")
    args = p.parse_args(argv)
    tls = ClientTls(args.ssl_ca, args.ssl_cert, args.ssl_key) if args.ssl_ca else None
    shape = [int(s) for s in args.shape.split(",")]
    inputs = [make_input(n, shape, args.datatype, seed) for seed, n in enumerate(args.input_name.split(","))]
    rows = []
    for conc in (int(c) for c in args.concurrency.split(",")):
        try:
            result = run(args.url, args.protocol, args.model, inputs, conc, args.duration, args.warmup,
                         args.format == "binary", tls)
        except LoadgenError as exc:
            sys.exit(str(exc))
        rows.append((conc, result))
    fmt = args.format if args.protocol == "http" else "raw"
    print(f"{args.model} over {args.protocol} ({fmt}), {args.datatype} {shape}, {args.duration:g} s per level\n")
    print(format_table(rows))


if __name__ == "__main__":
    main()
