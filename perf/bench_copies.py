#!/usr/bin/env python3
"""The copy ledger: CPU per MiB that each process spends moving a large tensor through tritond,
in units of one memcpy, so a copy shows up as a number.

tritond serves the example repository's identity_fp32 (Python backend, any length); the shared
load generator sends one FP32 tensor of each --sizes and gets it back, over HTTP with the binary
tensor extension, over gRPC, and with input and output in registered system shared-memory
regions (HTTP and gRPC). For each case it reads the CPU time of every process of the server's
tree from /proc over the window (as bench_cpu.py) and prints µs per MiB carried each way
(request bytes; the response carries as many) by process, and that figure divided by what one
memcpy of the same size costs on this host, measured in this run: "copies" per process. Each
process's figure is split into user and kernel time: the kernel's is mostly the sockets' own
copies and TCP processing, which any server pays; the user time is where our copies show. The
client's own cost is not the server's and is left out. The grpc-floor case sends the gRPC case's
request to a bare grpc.aio server that answers each request with its own bytes (grpc_echo.py):
what grpcio itself costs per byte, below which no gRPC frontend on it can go. The http-intake
case sends the tensor in the HTTP body and asks for the output in a registered region, so only
the request carries it: the HTTP frontend's CPU per MiB is then what taking a body in costs, and
its inverse (printed as "intake") is the rate one frontend core takes bodies in at.

  python perf/bench_copies.py                          # 64 KiB, 1 MiB, 4 MiB; c=1
  python perf/bench_copies.py --sizes 4M --concurrency 1,16 --cases http-binary,grpc-shm
  python perf/bench_copies.py --sizes 4M --cases grpc,grpc-floor
  python perf/bench_copies.py --sizes 1M --cases http-intake
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from bench_core import READY_TIMEOUT_S, Server, build_repository, free_port
from bench_cpu import TICKS, role

from tritond.frontend.metrics import tree

from tritond.perf import loadgen

MODEL = "identity_fp32"
CASES = ("http-binary", "grpc", "http-shm", "grpc-shm", "grpc-floor", "http-intake")
ECHO = Path(__file__).with_name("grpc_echo.py")
MIB = 1 << 20


def sample(root: int) -> dict[str, tuple[float, float]]:
    """(user, kernel) CPU seconds so far of every process of the tree, by role."""
    out: dict[str, tuple[float, float]] = {}
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        r = role(pid)
        user, kernel = out.get(r, (0.0, 0.0))
        out[r] = (user + int(fields[11]) / TICKS, kernel + int(fields[12]) / TICKS)
    return out


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def memcpy_us_per_mib(nbytes: int) -> float:
    """One copy of `nbytes` between two buffers that stay allocated, best of several."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    reps = max(8, (256 * MIB) // nbytes)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(dst, src)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e6 / (nbytes / MIB)


class Regions:
    """A registered input region holding the tensor and an output region of the same size."""

    def __init__(self, http_url: str, x: np.ndarray) -> None:
        tag = secrets.token_hex(3)
        self.client = httpclient.InferenceServerClient(http_url)
        self.names = [f"copies_in_{tag}", f"copies_out_{tag}"]
        self.handles = [shm.create_shared_memory_region(n, "/" + n, x.nbytes) for n in self.names]
        shm.set_shared_memory_region(self.handles[0], [x])
        for n in self.names:
            self.client.register_system_shared_memory(n, "/" + n, x.nbytes)
        self.refs = {"in": loadgen.ShmRef(self.names[0], x.nbytes), "out": loadgen.ShmRef(self.names[1], x.nbytes)}

    def close(self) -> None:
        for n in self.names:
            self.client.unregister_system_shared_memory(n)
        for h in self.handles:
            shm.destroy_shared_memory_region(h)
        self.client.close()


class Echo:
    """grpc_echo.py as a child process, serving once it accepts connections."""

    def __init__(self) -> None:
        self.url = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([sys.executable, str(ECHO), self.url.rsplit(":", 1)[1]])
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                asyncio.run(self.probe())
                return
            except RuntimeError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise
                time.sleep(0.1)

    async def probe(self) -> None:
        driver = loadgen.Driver(self.url, "grpc", [b""])
        try:
            await driver.send_one()
        finally:
            await driver.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def request(case: str, server: Server, nbytes: int, regions: Regions | None) -> tuple[str, str, bytes]:
    """(url, protocol, the request's bytes) of one case."""
    inp = loadgen.make_input("INPUT0", (nbytes // 4,), "FP32")
    in_shm = {"INPUT0": regions.refs["in"]} if regions and case.endswith("shm") else None
    out_shm = {"OUTPUT0": regions.refs["out"]} if regions else None
    if case.startswith("http"):
        host, port = loadgen.split_target(server.http)
        return server.http, "http", loadgen.http_request(host, port, MODEL, [inp], True, input_shm=in_shm,
                                                        output_shm=out_shm)
    return server.grpc, "grpc", loadgen.grpc_request(MODEL, [inp], input_shm=in_shm, output_shm=out_shm)


async def window(url: str, protocol: str, body: bytes, root: int, concurrency: int, seconds: float,
                 warmup: float) -> tuple[int, dict[str, tuple[float, float]]]:
    driver = loadgen.Driver(url, protocol, [body])
    try:
        await driver.send_one()
        await driver.start(concurrency=concurrency)
        await asyncio.sleep(warmup)
        driver.take()
        before = sample(root)
        await asyncio.sleep(seconds)
        done, _, _ = driver.take()
        after = sample(root)
    finally:
        await driver.close()
    return len(done), {k: (u - before.get(k, (0.0, 0.0))[0], s - before.get(k, (0.0, 0.0))[1])
                       for k, (u, s) in after.items()}


def run(args: argparse.Namespace) -> str:
    rows = ["| case | size | conc | infer/s | server µs/MiB | server copies | by process: µs/MiB user + kernel (copies) |",
            "|---|---:|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory(prefix="bench-copies-") as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository, [MODEL])
        server = Server(repository, Path(tmp) / "tritond.log", ["--allow-client-shm=true"])
        try:
            server.wait_ready(READY_TIMEOUT_S)
            for nbytes in args.sizes:
                floor = memcpy_us_per_mib(nbytes)
                rows_of_size = []
                for case in args.cases:
                    with_regions = case.endswith("shm") or case == "http-intake"
                    regions = Regions(server.http, np.ones(nbytes // 4, np.float32)) if with_regions else None
                    echo = Echo() if case == "grpc-floor" else None
                    try:
                        url, protocol, body = request(case, server, nbytes, regions)
                        root = server.proc.pid
                        if echo is not None:
                            url, root = echo.url, echo.proc.pid
                        for c in args.concurrency:
                            count, cpu = asyncio.run(window(url, protocol, body, root, c, args.window, args.warmup))
                            mib = max(count, 1) * nbytes / MIB
                            per = {r: (u * 1e6 / mib, k * 1e6 / mib) for r, (u, k) in cpu.items()}
                            total = sum(u + k for u, k in per.values())
                            parts = ", ".join(f"{r} {u:.0f} + {k:.0f} ({(u + k) / floor:.1f})"
                                              for r, (u, k) in sorted(per.items(), key=lambda kv: -sum(kv[1]))
                                              if u + k >= 1)
                            if case == "http-intake":
                                parts += f"; intake {MIB / 1e3 / max(sum(per.get('http frontend', (0, 0))), 1):.2f} GB/s"
                            rows_of_size.append(f"| {case} | {nbytes // 1024} KiB | {c} | {count / args.window:,.0f} | "
                                                f"{total:.0f} | {total / floor:.1f} | {parts} |")
                    finally:
                        if regions is not None:
                            regions.close()
                        if echo is not None:
                            echo.close()
                rows += rows_of_size
                rows.append(f"| one memcpy | {nbytes // 1024} KiB | | | {floor:.0f} | 1.0 | |")
        finally:
            server.stop()
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                   default=[64 << 10, 1 << 20, 4 << 20], help="tensor sizes in bytes (K and M suffixes)")
    p.add_argument("--cases", type=lambda s: s.split(","), default=list(CASES), help=", ".join(CASES))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    p.add_argument("--window", type=float, default=3.0, help="measured seconds per case")
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
