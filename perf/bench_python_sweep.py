#!/usr/bin/env python3
"""Instances x concurrency for a numpy-heavy Python model: does adding instances add
throughput on this host, or do their BLAS pools fight over its cores?

The model multiplies a square FP32 matrix by itself per request (--matrix 96: about 0.1 ms on
one core) and returns 16 values of it. One server per instance count (1, 2, 4) serves it over
gRPC, closed loop at each concurrency (1, 8, 32, 128); each cell prints infer/s and the ratio
to the 1-instance server at the same concurrency. The servers of one instance count run side
by side and take turns, so the host's load drifts alike for each. Servers:

  tritond          the thread budget (each worker's pools: the usable cores / the instances)
  tritond threads=N  (--threads N) INTRA_OP_THREAD_COUNT=N in the model's config
  tritond all-cores  INTRA_OP_THREAD_COUNT=0 in the model's config: every worker's pools take
                   every usable core, as OpenBLAS does unbudgeted (what tritond did before)
  Triton           tritonserver of perf/anchors.py (its Python backend stubs size nothing);
                   left out with --no-triton or when its folder cannot be prepared

  python perf/bench_python_sweep.py                       # 3 s windows, every server
  python perf/bench_python_sweep.py --threads 1 --rounds 3  # and tritond with one thread per worker
  python perf/bench_python_sweep.py --no-triton --window 2 --instances 1,2 --concurrency 1,8
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from bench_core import READY_TIMEOUT_S, Server, ServerStartError

from tritond.perf import loadgen

MODEL = "matmul"
MODEL_PY = '''\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        n = int(json.loads(args["model_config"])["parameters"]["MATRIX"]["string_value"])
        self.a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = (self.a @ self.a)[0, :16] + x
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y.astype(np.float32))]))
        return responses
'''


def write_repository(dest: Path, instances: int, matrix: int, threads: str | None) -> Path:
    """One model, `instances` CPU instances; `threads`: its INTRA_OP_THREAD_COUNT (None: none)."""
    (dest / MODEL / "1").mkdir(parents=True)
    (dest / MODEL / "1" / "model.py").write_text(MODEL_PY)
    params = {"MATRIX": str(matrix), **({"INTRA_OP_THREAD_COUNT": threads} if threads is not None else {})}
    lines = [f'name: "{MODEL}"', 'backend: "python"', "max_batch_size: 0",
             'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]',
             'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]',
             f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (dest / MODEL / "config.pbtxt").write_text("\n".join(lines) + "\n")
    return dest


def budget_lines(log: Path) -> list[str]:
    """What the thread budget gave each instance (the broker's log line per instance)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [m.group(1) for m in re.finditer(r"(model '" + MODEL + r"' version 1 instance .*)", text)]


def sweep(variants: list[tuple[str, Callable[[Path, Path], object], str | None]], tmp: Path,
          args: argparse.Namespace, results: dict, notes: list[str]) -> None:
    """Per instance count, every variant's server runs side by side (idle but for the one
    measured) and the variants take turns at each concurrency, so the host's load drifts alike
    for all of them; with --rounds the median of the rounds counts."""
    inputs = [loadgen.make_input("INPUT0", (16,), "FP32")]
    for n in args.instances:
        servers: dict[str, object] = {}
        logs: dict[str, Path] = {}
        try:
            for name, start, threads in variants:
                repo = write_repository(tmp / f"{name}-{n}" / "models", n, args.matrix, threads)
                logs[name] = tmp / f"{name}-{n}.log"
                servers[name] = start(repo, logs[name])
            for name in list(servers):
                try:
                    servers[name].wait_ready(READY_TIMEOUT_S)
                except ServerStartError as exc:
                    if name != "Triton":
                        raise
                    notes.append(f"Triton left out at {n} instances: {str(exc).splitlines()[0]}")
                    servers.pop(name).stop()
            for c in args.concurrency:
                for _ in range(args.rounds):
                    for name, server in servers.items():
                        r = loadgen.run(server.grpc, "grpc", MODEL, inputs, c, args.window, args.warmup)
                        results.setdefault((name, n, c), []).append(r.infer_per_s)
                        print(f"{name}: {n} instance(s), c={c}: {r.infer_per_s:,.0f} infer/s, "
                              f"p50 {r.p50_ms:.2f} ms, {r.errors} errors", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
        if n == max(args.instances):
            notes += [f"{name}, {n} instances: {line}" for name in servers if name.startswith("tritond")
                      for line in budget_lines(logs[name])[:1]]


def median(values: list[float] | None) -> float | None:
    return float(statistics.median(values)) if values else None


def render(results: dict, servers: list[str], args: argparse.Namespace) -> str:
    head = ["instances", "conc"]
    for s in servers:
        head += [f"{s} infer/s", f"{s} x 1-inst"]
    if "Triton" in servers:
        head += ["tritond / Triton"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for n in args.instances:
        for c in args.concurrency:
            cells = [str(n), str(c)]
            for s in servers:
                v, one = median(results.get((s, n, c))), median(results.get((s, min(args.instances), c)))
                cells += [f"{v:,.0f}" if v is not None else "-",
                          f"{v / one:.2f}" if v and one else "-"]
            if "Triton" in servers:
                v, t = median(results.get(("tritond", n, c))), median(results.get(("Triton", n, c)))
                cells.append(f"{v / t:.2f}" if v and t else "-")
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=ints, default=[1, 2, 4])
    p.add_argument("--concurrency", type=ints, default=[1, 8, 32, 128])
    p.add_argument("--window", type=float, default=3.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    p.add_argument("--matrix", type=int, default=96, help="the model's square matrix side (96: ~0.1 ms)")
    p.add_argument("--rounds", type=int, default=1, help="turns per cell (the median counts)")
    p.add_argument("--threads", type=ints, default=[], help="also tritond with INTRA_OP_THREAD_COUNT=each of these")
    p.add_argument("--no-all-cores", action="store_true", help="leave out the unbudgeted tritond")
    p.add_argument("--no-triton", action="store_true", help="leave out real Triton")
    p.add_argument("--anchors-dir", type=Path, default=Path(os.environ.get("ANCHORS_DIR", "/tmp/anchors")),
                   help="the bench-anchors folder holding triton-venv and triton_dist (made when missing)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    variants: list[tuple[str, Callable[[Path, Path], object], str | None]] = [
        ("tritond", lambda repo, log: Server(repo, log), None)]
    for threads in args.threads:
        variants.append((f"tritond threads={threads}", lambda repo, log: Server(repo, log), str(threads)))
    if not args.no_all_cores:
        variants.append(("tritond all-cores", lambda repo, log: Server(repo, log), "0"))
    notes = [f"{args.matrix}x{args.matrix} FP32 matmul per request, gRPC, closed loop, {args.window:g} s windows "
             f"after {args.warmup:g} s warm-up; usable cores: {len(os.sched_getaffinity(0))}"]
    if not args.no_triton:
        from anchors import AnchorsError, Triton, anchors_ready, prepare
        try:
            if not anchors_ready(args.anchors_dir):
                prepare(args.anchors_dir)
            variants.append(("Triton", lambda repo, log: Triton(args.anchors_dir, repo, log), None))
        except AnchorsError as exc:
            notes.append(f"Triton left out: {exc}".splitlines()[0])
    results: dict = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-python-sweep-") as tmp:
        try:
            sweep(variants, Path(tmp), args, results, notes)
        except ServerStartError as exc:
            print(exc, file=sys.stderr)
            return 1
    servers = [name for name, _, _ in variants if any(k[0] == name for k in results)]
    print(render(results, servers, args))
    print()
    print("\n".join(notes + [f"took {time.monotonic() - started:.0f} s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
