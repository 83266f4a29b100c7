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
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from anchors import Triton, anchors_ready
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


async def _window(server: Server | Triton, streams: int, depth: int, seconds: float) -> tuple[int, float, dict]:
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
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--anchors-dir", type=Path, help="a Triton folder run_anchors.sh prepared: Triton beside tritond")
    args = p.parse_args()
    if args.anchors_dir is not None and not anchors_ready(args.anchors_dir):
        p.error(f"{args.anchors_dir} holds no prepared Triton (ANCHORS_DIR={args.anchors_dir} SKIP_PA=1 "
                f"SKIP_LOADGEN=1 bash ../shared/bench-anchors/run_anchors.sh)")
    rows: dict[str, list[tuple[int, float, dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpc-stream-") as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository, [MODEL])
        servers: dict[str, Server | Triton] = {"tritond": Server(repository, Path(tmp) / "tritond.log")}
        if args.anchors_dir is not None:
            servers["Triton"] = Triton(args.anchors_dir, repository, Path(tmp) / "triton.log")
        try:
            for server in servers.values():
                server.wait_ready(READY_TIMEOUT_S)
            for _ in range(args.rounds):
                for name, server in servers.items():
                    try:
                        window = asyncio.run(_window(server, args.streams, args.depth, args.duration))
                    except grpc.RpcError as e:
                        raise SystemExit(f"{name}: a stream failed: {e.code()} {e.details()}") from None
                    rows.setdefault(name, []).append(window)
        finally:
            for server in servers.values():
                server.stop()
    print("| server | streams | in flight each | req/s | CPU us/request (all) | by process |")
    print("|---|---:|---:|---:|---:|---|")
    per_request = {name: [sum(cpu.values()) / n * 1e6 for n, _, cpu in windows] for name, windows in rows.items()}
    for name, windows in rows.items():
        n, elapsed, cpu = windows[-1]
        roles: dict[str, float] = {}
        for (role, _), seconds in cpu.items():
            roles[role] = roles.get(role, 0.0) + seconds
        shown = ", ".join(f"{r} {v / n * 1e6:.0f}" for r, v in sorted(roles.items(), key=lambda kv: -kv[1])
                          if v / n * 1e6 >= 0.5)
        cpus = " / ".join(f"{v:.0f}" for v in per_request[name])
        print(f"| {name} | {args.streams} | {args.depth} | {n / elapsed:,.0f} | {cpus} | {shown} (last round) |")
    if "Triton" in rows:
        ratio = statistics.median(a / b for a, b in zip(per_request["tritond"], per_request["Triton"]))
        print(f"\ntritond / Triton, CPU per request: {ratio:.2f} (median of {args.rounds} rounds' ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
