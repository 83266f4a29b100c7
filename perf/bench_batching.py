#!/usr/bin/env python3
"""Batching benchmark: what do the dynamic batcher and extra instances buy?

Two measurements on one server, each against a baseline measured in the same run:
  1. mlp_onnx (dynamic batching) vs mlp_onnx_nobatch (the same graph without it), [1,256] FP32,
     at each concurrency over HTTP (binary tensors) and gRPC: infer/s, p50/p99 and the ratios.
     Goal: >= 3x throughput at concurrency 16 with p99 no worse than 2x.
  2. A Python identity model (like identity_dyn: dims [-1]) with 1, 2 and 4 instances at one
     concurrency, with dynamic batching and without: infer/s, p50/p99 and the ratio against
     1 instance.

  python perf/bench_batching.py                      # builds the example repository, starts tritond
  python perf/bench_batching.py --protocols http --duration 3
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tritond.perf import loadgen
from bench_core import Server, ServerStartError, build_repository

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
MLP_SHAPE = (1, 256)
IDENTITY_SHAPE = (1, 16)
INSTANCE_COUNTS = (1, 2, 4)
# scheduler -> (model name prefix, scheduling block of its config)
IDENTITY_VARIANTS = {"dynamic batching": ("identity_dyn_x", "dynamic_batching { }"), "no batching": ("identity_x", "")}

IDENTITY_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{batching}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def add_identity_models(repository: Path) -> None:
    """<prefix><N>: the example identity_dyn model.py served by N instances, per variant."""
    for prefix, batching in IDENTITY_VARIANTS.values():
        for count in INSTANCE_COUNTS:
            name = f"{prefix}{count}"
            (repository / name / "1").mkdir(parents=True, exist_ok=True)
            shutil.copy(repository / "identity_dyn" / "1" / "model.py", repository / name / "1" / "model.py")
            (repository / name / "config.pbtxt").write_text(
                IDENTITY_CONFIG.format(name=name, count=count, batching=batching))


def measure(server: Server, protocol: str, models: list[str], shape: tuple[int, ...], conc: int,
            args: argparse.Namespace) -> list[loadgen.Result]:
    """Each model `args.rounds` times, interleaved so load from elsewhere hits all alike;
    per model the median of each figure."""
    target = server.http if protocol == "http" else server.grpc
    inputs = [loadgen.make_input("INPUT0", shape, "FP32")]
    runs: dict[str, list[loadgen.Result]] = {m: [] for m in models}
    for _ in range(args.rounds):
        for model in models:
            runs[model].append(loadgen.run(target, protocol, model, inputs, conc, args.duration, args.warmup, binary=True))
    return [
        loadgen.Result(
            statistics.median(r.infer_per_s for r in rs), statistics.median(r.p50_ms for r in rs),
            statistics.median(r.p90_ms for r in rs), statistics.median(r.p99_ms for r in rs),
            sum(r.count for r in rs), sum(r.errors for r in rs),
        )
        for rs in runs.values()
    ]


def cells(r: loadgen.Result) -> str:
    return f"{r.infer_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors}"


def bench_batching(server: Server, protocols: list[str], args: argparse.Namespace) -> str:
    lines = [
        "### mlp_onnx [1,256] FP32: dynamic batching vs none (same graph, 1 instance each)",
        "",
        "| proto | conc | batched infer/s | p50 ms | p99 ms | err | unbatched infer/s | p50 ms | p99 ms | err "
        "| throughput x | p99 x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in protocols:
        for conc in args.concurrency:
            base, dyn = measure(server, protocol, ["mlp_onnx_nobatch", "mlp_onnx"], MLP_SHAPE, conc, args)
            lines.append(
                f"| {protocol} | {conc} | {cells(dyn)} | {cells(base)} "
                f"| {dyn.infer_per_s / base.infer_per_s:.2f} | {dyn.p99_ms / base.p99_ms:.2f} |"
            )
    return "\n".join(lines)


def bench_instances(server: Server, protocols: list[str], args: argparse.Namespace) -> str:
    conc = args.instance_concurrency
    lines = [
        f"### Python identity [1,16] FP32, concurrency {conc}: instances 1 vs 2 vs 4",
        "",
        "| proto | scheduler | instances | infer/s | p50 ms | p99 ms | err | x 1 instance |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol in protocols:
        for variant, (prefix, _) in IDENTITY_VARIANTS.items():
            results = measure(server, protocol, [f"{prefix}{n}" for n in INSTANCE_COUNTS], IDENTITY_SHAPE, conc, args)
            for count, r in zip(INSTANCE_COUNTS, results):
                ratio = r.infer_per_s / results[0].infer_per_s
                lines.append(f"| {protocol} | {variant} | {count} | {cells(r)} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocols", default="http,grpc", help="comma-separated: http, grpc")
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16, 32])
    p.add_argument("--instance-concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per point and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point; medians are shown")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per point")
    p.add_argument("--skip-instances", action="store_true", help="only the batching comparison")
    args = p.parse_args()
    protocols = [x for x in args.protocols.split(",") if x]

    with tempfile.TemporaryDirectory(prefix="bench_batching_") as tmp:
        repository = Path(tmp) / "models"
        build_repository(repository)
        add_identity_models(repository)
        server = Server(repository, Path(tmp) / "tritond.log", [] if "grpc" in protocols else ["--allow-grpc=false"])
        notes = []
        try:
            server.wait_ready(READY_TIMEOUT_S)
            if "grpc" in protocols and not server.grpc_listening():
                protocols.remove("grpc")
                notes.append("gRPC frontend not listening: measured HTTP only")
            reports = [bench_batching(server, protocols, args)]
            if not args.skip_instances:
                reports.append(bench_instances(server, protocols, args))
        except ServerStartError as exc:
            sys.exit(str(exc))
        except loadgen.LoadgenError as exc:
            sys.exit(f"{exc}\n{server.log_tail()}")
        finally:
            server.stop()
    cpus = os.cpu_count()
    print(f"tritond batching benchmark: median of {args.rounds} interleaved rounds of {args.duration:g} s "
          f"(after {args.warmup:g} s warm-up) per point, {cpus} CPUs shared by client and server\n")
    for note in notes:
        print(f"note: {note}\n")
    print("\n\n".join(reports))


if __name__ == "__main__":
    main()
