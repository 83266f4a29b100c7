#!/usr/bin/env python3
"""CPU time per request of requests to a model that is not decoupled on gRPC streams
(ModelStreamInfer), by process role, as perf/bench_cpu.py measures unary ones: every stream keeps
`--depth` requests in flight for `--duration` seconds against identity_fp32 of the example
repository. Such responses leave a stream in request order (as Triton writes them), which is what
this path pays for beside a unary call.

  python perf/bench_grpc_stream.py [--streams 16 --depth 4 --duration 10]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from bench_core import READY_TIMEOUT_S, Server, build_repository
from bench_cpu import sample

MODEL = "identity_fp32"


def _request(i: int) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name=MODEL, id=str(i))
    t = r.inputs.add()
    t.name, t.datatype = "INPUT0", "FP32"
    t.shape.extend([16])
    r.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return r


async def _stream(stub: service_pb2_grpc.GRPCInferenceServiceStub, depth: int, until: float,
                  counts: list[int]) -> None:
    """One stream: a new request for each answer until `until`, `depth` in flight."""
    credits: asyncio.Queue = asyncio.Queue()

    async def requests():
        i = 0
        while await credits.get():
            yield _request(i)
            i += 1
    call = stub.ModelStreamInfer(requests())
    for _ in range(depth):
        credits.put_nowait(True)
    async for response in call:
        if response.error_message:
            raise RuntimeError(response.error_message)
        counts[0] += 1
        more = time.monotonic() < until
        credits.put_nowait(more)
        if not more:
            break
    call.cancel()


async def _window(server: Server, streams: int, depth: int, seconds: float) -> tuple[int, float, dict]:
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        counts = [0]
        await asyncio.gather(*(_stream(stub, depth, time.monotonic() + 1.0, counts) for _ in range(streams)))
        counts = [0]
        before, t0 = sample(server.proc.pid), time.perf_counter()
        await asyncio.gather(*(_stream(stub, depth, time.monotonic() + seconds, counts) for _ in range(streams)))
        after, elapsed = sample(server.proc.pid), time.perf_counter() - t0
    return counts[0], elapsed, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-grpc-stream-") as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository, [MODEL])
        server = Server(repository, Path(tmp) / "tritond.log")
        server.wait_ready(READY_TIMEOUT_S)
        try:
            n, elapsed, cpu = asyncio.run(_window(server, args.streams, args.depth, args.duration))
        finally:
            server.stop()
    roles: dict[str, float] = {}
    for (role, _), seconds in cpu.items():
        roles[role] = roles.get(role, 0.0) + seconds
    print("| streams | in flight each | req/s | CPU us/request (all) | by process |")
    print("|---:|---:|---:|---:|---|")
    shown = ", ".join(f"{r} {s / n * 1e6:.0f}" for r, s in sorted(roles.items(), key=lambda kv: -kv[1]) if s / n * 1e6 >= 0.5)
    print(f"| {args.streams} | {args.depth} | {n / elapsed:,.0f} | {sum(cpu.values()) / n * 1e6:.0f} | {shown} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
