#!/usr/bin/env python3
"""CPU time per request, by process and by thread kind, read from /proc.

Runs the shared closed-loop load generator against a server for a fixed window and divides
the CPU time every process of the server's tree used in that window (user + system, every
thread, ZeroMQ's I/O threads included) by the requests completed. Unlike throughput, CPU per
request barely moves when the machine is shared, so it is the figure to judge a change of
the request path by.

  python perf/bench_cpu.py --start                              # tritond on the example repository
  python perf/bench_cpu.py --url 127.0.0.1:8000 --pid <server pid>
  python perf/bench_cpu.py --start --cases identity-http-json,identity-grpc --concurrency 1,16
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tritond.frontend.metrics import tree
from tritond.perf import loadgen
from bench_core import READY_TIMEOUT_S, Server, build_repository

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    protocol: str       # http | grpc
    binary: bool
    shape: tuple[int, ...]


CASES = {
    "identity-http-json": Case("identity-http-json", "identity_fp32", "http", False, (16,)),
    "identity-http-binary": Case("identity-http-binary", "identity_fp32", "http", True, (16,)),
    "identity-grpc": Case("identity-grpc", "identity_fp32", "grpc", True, (16,)),
    "mlp-grpc": Case("mlp-grpc", "mlp_onnx", "grpc", True, (1, 256)),
    # the anchors' dynamically batched identity (run_anchors.sh batch16-grpc; not in the example repository)
    "batched-grpc": Case("batched-grpc", "identity_fp32_dyn", "grpc", True, (1, 16)),
}

# real Triton's processes (perf/anchors.py), by program name
TRITON_ROLES = {"tritonserver": "tritonserver", "triton_python_backend_stub": "python stub"}


def role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if argv.startswith("tritond-worker"):
        return "worker"
    program = os.path.basename(argv.split(" ", 1)[0])
    if program in TRITON_ROLES:
        return TRITON_ROLES[program]
    for key, name in (("tritond.broker.main", "broker"), ("tritond.frontend.http", "http frontend"),
                      ("tritond.frontend.grpc", "grpc frontend"), ("tritond.workers.template", "template"),
                      ("tritond.cli", "supervisor"), ("tritond start", "supervisor")):
        if key in argv:
            return name
    return "other"


def thread_kind(comm: str) -> str:
    return "zmq I/O" if comm.startswith("ZMQbg") else ("main" if comm.startswith(("python", "tritond")) else "other")


def sample(root: int) -> dict[tuple[str, str], float]:
    """CPU seconds so far, by (process role, thread kind), over the whole tree."""
    out: dict[tuple[str, str], float] = {}
    for pid in tree(root):
        r = role(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            key = (r, thread_kind(comm))
            out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


async def measure(url: str, root: int, case: Case, concurrency: int, duration: float,
                  warmup: float) -> tuple[int, float, dict[tuple[str, str], float]]:
    """(requests completed, seconds, CPU seconds by (role, thread kind)) of one window."""
    inp = loadgen.make_input("INPUT0", case.shape, "FP32")
    if case.protocol == "http":
        request = loadgen.http_request(*loadgen.split_target(url), case.model, [inp], case.binary)
    else:
        request = loadgen.grpc_request(case.model, [inp])
    driver = loadgen.Driver(url, case.protocol, [request])
    try:
        await driver.send_one()
        await driver.start(concurrency=concurrency)
        await asyncio.sleep(warmup)
        driver.take()
        before, t0 = sample(root), time.perf_counter()
        await asyncio.sleep(duration)
        samples, _, _ = driver.take()
        after, elapsed = sample(root), time.perf_counter() - t0
    finally:
        await driver.close()
    return len(samples), elapsed, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--start", action="store_true", help="start tritond on the example repository")
    target.add_argument("--url", help="host:port (HTTP; gRPC is --grpc-url) of a running server")
    p.add_argument("--grpc-url", help="host:port of the running server's gRPC endpoint")
    p.add_argument("--pid", type=int, help="the running server's top process (its tree is measured)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="bench-cpu-")
    server = None
    if args.start:
        repository = Path(tmp.name) / "models"
        build_repository(repository, ["identity_fp32", "mlp_onnx"])
        server = Server(repository, Path(tmp.name) / "tritond.log")
        server.wait_ready(READY_TIMEOUT_S)
    try:
        http_url = server.http if server else args.url
        grpc_url = server.grpc if server else args.grpc_url
        root = server.proc.pid if server else args.pid
        print("| case | conc | infer/s | CPU us/request (all) | by process and thread |")
        print("|---|---:|---:|---:|---|")
        for name in args.cases.split(","):
            case = CASES[name]
            url = http_url if case.protocol == "http" else grpc_url
            for c in (int(x) for x in args.concurrency.split(",")):
                count, elapsed, cpu = asyncio.run(measure(url, root, case, c, args.duration, args.warmup))
                n = max(count, 1)
                total = sum(cpu.values()) / n * 1e6
                parts = ", ".join(f"{r}/{k} {v / n * 1e6:.0f}" for (r, k), v in
                                  sorted(cpu.items(), key=lambda kv: -kv[1]) if v / n * 1e6 >= 5)
                print(f"| {name} | {c} | {count / elapsed:,.0f} | {total:.0f} | {parts} |")
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
