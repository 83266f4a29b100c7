#!/usr/bin/env python3
"""What the frontends' server libraries cost per request with nothing behind them.

tritond's HTTP frontend is uvicorn (httptools, uvloop) and its gRPC frontend grpc.aio. This
starts each bare, in a process of its own, answering the same requests the identity benchmark
sends (16 FP32) with a fixed answer and no other work: a raw ASGI app that reads the body, and
a generic grpc.aio handler for ModelInfer that takes and returns bytes. The server process's
CPU per request (every thread, from /proc) is the floor any frontend built on that library
pays, to set beside `perf/bench_cpu.py`'s frontend figures and Triton's whole-server cost.

  python perf/bench_floor.py                      # HTTP JSON, HTTP binary, gRPC at c=1 and 16
  python perf/bench_floor.py --cases grpc --concurrency 16 --duration 5
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

from tritond.perf import loadgen
from bench_cpu import sample

HTTP_SERVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"model_name":"identity_fp32","outputs":[]}'})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            log_level="warning", access_log=False)
"""

GRPC_SERVER = """
import asyncio, sys, grpc
async def infer(request, context):
    return b""
async def main():
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(infer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler}),))
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""

CASES = {"http-json": ("http", False), "http-binary": ("http", True), "grpc": ("grpc", True)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(code: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the bare server did not start")


async def measure(url: str, pid: int, protocol: str, binary: bool, concurrency: int, duration: float,
                  warmup: float) -> tuple[float, float]:
    """(requests/s, server CPU µs per request)."""
    inp = loadgen.make_input("INPUT0", (1, 16), "FP32")
    if protocol == "http":
        request = loadgen.http_request(*loadgen.split_target(url), "identity_fp32", [inp], binary)
    else:
        request = loadgen.grpc_request("identity_fp32", [inp])
    driver = loadgen.Driver(url, protocol, [request])
    try:
        await driver.send_one()
        await driver.start(concurrency=concurrency)
        await asyncio.sleep(warmup)
        driver.take()
        before, t0 = sum(sample(pid).values()), time.perf_counter()
        await asyncio.sleep(duration)
        samples, _, _ = driver.take()
        after, elapsed = sum(sample(pid).values()), time.perf_counter() - t0
    finally:
        await driver.close()
    n = max(len(samples), 1)
    return n / elapsed, (after - before) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    print("| bare server | case | conc | req/s | server CPU us/request |")
    print("|---|---|---:|---:|---:|")
    for name in args.cases.split(","):
        protocol, binary = CASES[name]
        port = free_port()
        proc = start(HTTP_SERVER if protocol == "http" else GRPC_SERVER, port)
        try:
            for c in (int(x) for x in args.concurrency.split(",")):
                rate, cpu = asyncio.run(measure(f"127.0.0.1:{port}", proc.pid, protocol, binary, c,
                                                args.duration, args.warmup))
                label = "uvicorn+httptools, raw ASGI" if protocol == "http" else "grpc.aio, generic handler"
                print(f"| {label} | {name} | {c} | {rate:,.0f} | {cpu:.0f} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
