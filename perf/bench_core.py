#!/usr/bin/env python3
"""Core benchmark: what does serving a model cost compared to calling it in-process?

Measures, in one run, requests/s and p50/p99 for
  identity_fp32  16 FP32 over HTTP JSON          (pure server overhead)
  mlp_onnx       [1,256] FP32 over HTTP binary   (a real ONNX model)
at each concurrency level, then the same mlp_onnx call made in-process with onnxruntime,
and reports the server's per-request overhead = server p50 at c=1 - in-process p50.

  python perf/bench_core.py --http 127.0.0.1:8000        # a server that is already running
  python perf/bench_core.py --start                      # start tritond on the example repository
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tritond.perf import loadgen

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class ServerStartError(RuntimeError):
    """tritond exited or never became ready; the message carries its log tail."""


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    shape: tuple[int, ...]
    binary: bool


CASES = (
    Case("identity_fp32, HTTP JSON, 16 f32", "identity_fp32", (16,), False),
    Case("mlp_onnx, HTTP binary, [1,256] f32", "mlp_onnx", (1, 256), True),
)
MLP_CASE = CASES[1]


@dataclass(frozen=True)
class InProcess:
    per_call_us: float
    calls_per_s: float
    p99_us: float


def build_repository(dest: Path, models: Sequence[str] | None = None) -> None:
    """Import examples/build_repository.py by path (examples/ is not a package) and build
    `models` (default: all) into dest."""
    spec = importlib.util.spec_from_file_location("build_repository", ROOT / "examples" / "build_repository.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(str(dest), models)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tritond_argv() -> list[str]:
    """The tritond console script of this interpreter's environment, else the module."""
    script = shutil.which("tritond", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "tritond.cli"]


def is_ready(http: str, context: ssl.SSLContext | None = None) -> bool:
    """Ready over HTTP, or over HTTPS when a client TLS context is given."""
    scheme = "https" if context else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{http}/v2/health/ready", timeout=2, context=context) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Server:
    """tritond as a child process: started on free ports, stopped with SIGTERM. env and cwd are
    the child's (default: this process's); new_session keeps a terminal's Ctrl-C from it, for a
    caller that stops it itself."""

    def __init__(self, repository: Path, log_path: Path, extra: Sequence[str] = (),
                 https: ssl.SSLContext | None = None, env: dict[str, str] | None = None,
                 cwd: Path | None = None, new_session: bool = False):
        self.https = https   # client context for readiness checks when HTTP is served over TLS
        self.http = f"127.0.0.1:{free_port()}"
        self.grpc = f"127.0.0.1:{free_port()}"
        argv = tritond_argv() + [
            "start",
            "--model-repository", str(repository),
            "--http-port", self.http.rsplit(":", 1)[1],
            "--grpc-port", self.grpc.rsplit(":", 1)[1],
            "--metrics-port", str(free_port()),
            *extra,
        ]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=new_session)

    def grpc_listening(self) -> bool:
        host, port = self.grpc.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not is_ready(self.http, self.https):
            if self.proc.poll() is not None:
                raise ServerStartError(f"tritond exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"tritond not ready after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def measure_in_process(onnx_path: Path, x: np.ndarray, seconds: float, threads: int) -> InProcess:
    """Time session.run call by call on the same input the server gets."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    feed = {"INPUT0": x}
    for _ in range(50):
        session.run(None, feed)
    times = []
    start = time.perf_counter()
    while (begin := time.perf_counter()) - start < seconds:
        session.run(None, feed)
        times.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - start
    us = np.array(times) * 1e6
    return InProcess(float(np.percentile(us, 50)), len(times) / elapsed, float(np.percentile(us, 99)))


def render(results: list[tuple[Case, int, loadgen.Result]], local: InProcess, threads: int) -> str:
    """Markdown table; the ratio compares throughput with the in-process onnxruntime loop."""
    rows = [
        "| case | conc | infer/s | p50 ms | p99 ms | errors | x in-process |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case, conc, r in results:
        ratio = f"{r.infer_per_s / local.calls_per_s:.2f}" if case is MLP_CASE else "-"
        rows.append(
            f"| {case.label} | {conc} | {r.infer_per_s:,.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.errors} | {ratio} |"
        )
    rows.append(
        f"| mlp_onnx, in-process onnxruntime ({threads or 'default'} threads) | 1 | {local.calls_per_s:,.0f} "
        f"| {local.per_call_us / 1e3:.3f} | {local.p99_us / 1e3:.3f} | 0 | 1.00 |"
    )
    mlp_c1 = next((r for case, conc, r in results if case is MLP_CASE and conc == 1), None)
    table = "\n".join(rows)
    table += f"\n\nin-process onnxruntime: {local.per_call_us:.1f} us per call, {local.calls_per_s:,.0f} calls/s"
    if mlp_c1 is not None:
        overhead_us = mlp_c1.p50_ms * 1e3 - local.per_call_us
        table += f"\nserver overhead per request (mlp_onnx p50 at c=1 - in-process p50): {overhead_us:.1f} us"
    return table


def bench(http: str, repository: Path, args: argparse.Namespace) -> str:
    results = []
    for case in CASES:
        inputs = [loadgen.make_input("INPUT0", case.shape, "FP32")]
        for conc in args.concurrency:
            r = loadgen.run(http, "http", case.model, inputs, conc, args.duration, args.warmup, case.binary)
            results.append((case, conc, r))
    x = loadgen.make_input("INPUT0", MLP_CASE.shape, "FP32").data
    local = measure_in_process(repository / "mlp_onnx" / "1" / "model.onnx", x, args.duration, args.ort_threads)
    return render(results, local, args.ort_threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--http", help="host:port of a running server's HTTP endpoint")
    target.add_argument("--start", action="store_true", help="start tritond on free ports and stop it afterwards")
    p.add_argument("--repository", type=Path, help="built example repository (default: build one in a temp dir)")
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per point")
    p.add_argument("--ort-threads", type=int, default=0, help="in-process intra-op threads (0: onnxruntime default)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_core_") as tmp:
        repository = args.repository
        if repository is None:
            repository = Path(tmp) / "models"
            build_repository(repository)
        server = None
        try:
            if args.start:
                server = Server(repository, Path(tmp) / "tritond.log")
                server.wait_ready(READY_TIMEOUT_S)
            http = server.http if server else args.http
            report = bench(http, repository, args)
        except ServerStartError as exc:
            sys.exit(str(exc))
        except loadgen.LoadgenError as exc:
            sys.exit(f"{exc}\n{server.log_tail()}" if server else str(exc))
        finally:
            if server is not None:
                server.stop()
    print(report)


if __name__ == "__main__":
    main()
