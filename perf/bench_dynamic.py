#!/usr/bin/env python3
"""Does the dynamic batcher pay? The same model with dynamic batching and without, on one
server, in alternating rounds: infer/s, mean batch size and CPU per request by process.

Two pairs of models, each pair identical but for `dynamic_batching { }` (max_batch_size 64,
1 instance, [1,16] FP32):
  py    the example identity_dyn model.py (Python backend)
  id    Triton's built-in `identity` backend (no model code at all)

The goal is that a batch never costs more CPU per request than single requests, and that
batching pays in throughput (Triton: 1.34-1.56x at gRPC c=16 for the Python identity).

  python perf/bench_dynamic.py                                  # gRPC c=16, 3 rounds of 5 s
  python perf/bench_dynamic.py --pairs py --protocol http --concurrency 4,16 --rounds 5
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cpu  # noqa: E402
from bench_core import READY_TIMEOUT_S, Server, build_repository  # noqa: E402

CONFIG = """name: "{name}"
backend: "{backend}"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{batching}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
PAIRS = {"py": "python", "id": "identity"}
SHAPE = (1, 16)


def variants(delay_us: int) -> list[tuple[str, str]]:
    """(model name suffix, scheduling block) of each model of a pair."""
    out = [("dyn", "dynamic_batching { }"), ("nob", "")]
    if delay_us:
        out.insert(1, ("delay", f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}"))
    return out


def add_models(repository: Path, pairs: list[str], delay_us: int) -> None:
    for pair in pairs:
        backend = PAIRS[pair]
        for suffix, batching in variants(delay_us):
            name = f"{pair}_{suffix}"
            (repository / name / "1").mkdir(parents=True, exist_ok=True)
            if backend == "python":
                shutil.copy(repository / "identity_dyn" / "1" / "model.py", repository / name / "1" / "model.py")
            (repository / name / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend, batching=batching))


def counts(http: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of the model so far."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=5) as resp:
        stats = json.load(resp)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="py,id", help="comma-separated: py, id")
    p.add_argument("--protocol", default="grpc", choices=["grpc", "http"])
    p.add_argument("--concurrency", default="16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--delay-us", type=int, default=0,
                   help="also a model with this max_queue_delay_microseconds (batches that fill up)")
    p.add_argument("--keep", action="store_true", help="print the server's address and wait (for profiling)")
    args = p.parse_args()
    pairs = [x for x in args.pairs.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="bench-dynamic-") as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository, ["identity_dyn"])
        add_models(repository, pairs, args.delay_us)
        shutil.rmtree(repository / "identity_dyn")
        server = Server(repository, Path(tmp) / "tritond.log")
        try:
            server.wait_ready(READY_TIMEOUT_S)
            url = server.grpc if args.protocol == "grpc" else server.http
            if args.keep:
                print(f"http {server.http} grpc {server.grpc} pid {server.proc.pid}", flush=True)
                sys.stdin.readline()
                return 0
            rows = []
            for conc in (int(c) for c in args.concurrency.split(",")):
                for pair in pairs:
                    runs: dict[str, list] = {f"{pair}_{suffix}": [] for suffix, _ in variants(args.delay_us)}
                    for i in range(args.rounds):
                        order = list(runs) if i % 2 == 0 else list(reversed(runs))
                        for model in order:
                            case = bench_cpu.Case(model, model, args.protocol, True, SHAPE)
                            n0, e0 = counts(server.http, model)
                            count, elapsed, cpu = asyncio.run(
                                bench_cpu.measure(url, server.proc.pid, case, conc, args.duration, args.warmup))
                            n1, e1 = counts(server.http, model)
                            runs[model].append((count / elapsed, cpu, count, (n1 - n0) / max(e1 - e0, 1)))
                    rows.append((conc, pair, runs))
        finally:
            server.stop()
    print(f"{args.protocol}, [1,16] FP32, 1 instance, max_batch_size 64; median of {args.rounds} alternating "
          f"rounds of {args.duration:g} s; CPU us/request by process (main + ZeroMQ threads)\n")
    print("| conc | model | infer/s | batch | CPU us/req | broker | worker | frontend | x unbatched infer/s | x CPU/req |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for conc, pair, runs in rows:
        summary = {}
        for model, rs in runs.items():
            by_role: dict[str, list[float]] = {}
            for _, cpu, count, _ in rs:
                per: dict[str, float] = {}
                for (r, _), v in cpu.items():
                    per[r] = per.get(r, 0.0) + v / max(count, 1) * 1e6
                for r in set(per) | set(by_role):
                    by_role.setdefault(r, []).append(per.get(r, 0.0))
            med = {r: statistics.median(v) for r, v in by_role.items()}
            summary[model] = (statistics.median(r[0] for r in rs), statistics.median(r[3] for r in rs),
                              statistics.median(sum(v / max(c, 1) * 1e6 for v in cpu.values()) for _, cpu, c, _ in rs),
                              med)
        base = summary[f"{pair}_nob"]
        for model, (ips, batch, total, med) in summary.items():
            fe = sum(v for r, v in med.items() if "frontend" in r)
            print(f"| {conc} | {model} | {ips:,.0f} | {batch:.1f} | {total:.0f} | {med.get('broker', 0):.0f} "
                  f"| {med.get('worker', 0):.0f} | {fe:.0f} | {ips / base[0]:.2f} | {total / base[2]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
