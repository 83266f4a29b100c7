#!/usr/bin/env python3
"""Does `tritond perf`'s own engine measure what NVIDIA's perf_analyzer measures?

Against one server, at each concurrency, runs `tritond perf --engine python` and
`tritond perf --engine perf_analyzer` (the real binary) with the same options, alternating
which goes first, for several rounds, and prints the medians of throughput and latency from
their `-f` CSVs with the ratio ours / perf_analyzer (goal: within 10%). The ratio is the median
of per-round ratios of the two back-to-back runs, which cancels the slow drift of a shared host.

With `--pin`, the server it starts runs on the first CPU and the load generators on the others,
so the two clients' own CPU cost (perf_analyzer's sync threads spend about twice what the asyncio
engine does per request) does not move the server's throughput on a small host.

  python perf/bench_perf_agreement.py                       # builds the example repository, starts tritond
  python perf/bench_perf_agreement.py --pin --rounds 9
  python perf/bench_perf_agreement.py --http 127.0.0.1:8000 --model mlp_onnx --rounds 5
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_core import Server, build_repository, tritond_argv

from tritond.perf.binary import find_perf_analyzer

READY_TIMEOUT_S = 180.0
FIGURES = ("Inferences/Second", "p50 latency", "p99 latency")


def measure(engine: str, url: str, model: str, concurrency: int, args: argparse.Namespace, out: Path) -> dict | None:
    cmd = client_cpus(args) + tritond_argv() + ["perf", "-m", model, "-u", url, "--engine", engine, "--concurrency-range",
                            str(concurrency), "-p", str(args.interval_ms), "-s", str(args.stability),
                            "-r", str(args.max_trials), "-f", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not out.exists():
        print(f"  {engine} c={concurrency}: failed ({proc.returncode}): {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    with open(out, newline="") as f:
        row = next(csv.DictReader(f))
    out.unlink()
    return {k: float(row[k]) for k in FIGURES}


def client_cpus(args: argparse.Namespace) -> list[str]:
    """taskset prefix for the load generators: every CPU but the server's (with --pin)."""
    cpus = sorted(os.sched_getaffinity(0))
    return ["taskset", "-c", ",".join(map(str, cpus[1:]))] if args.pin and len(cpus) > 1 else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--http", help="host:port of a running server (default: start one)")
    p.add_argument("--model", default="mlp_onnx")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval-ms", type=int, default=2000)
    p.add_argument("--stability", type=float, default=1000.0, help="percent; loose, so both keep the first windows")
    p.add_argument("--max-trials", type=int, default=3)
    p.add_argument("--pin", action="store_true", help="server on the first CPU, load generators on the rest")
    args = p.parse_args()
    if args.pin and args.http:
        sys.exit("--pin applies to the server this script starts (no --http)")
    if find_perf_analyzer() is None:
        sys.exit("perf_analyzer is not installed (bash scripts/install-perf-analyzer .venv/perf_analyzer)")
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-agreement-") as tmp:
        server = None
        url = args.http
        if url is None:
            repo = Path(tmp) / "models"
            build_repository(repo)
            every = os.sched_getaffinity(0)
            if args.pin:
                os.sched_setaffinity(0, {min(every)})    # the server's processes inherit it
            try:
                server = Server(repo, Path(tmp) / "server.log",
                                extra=["--model-control-mode=explicit", f"--load-model={args.model}"])
            finally:
                os.sched_setaffinity(0, every)
            server.wait_ready(READY_TIMEOUT_S)
            url = server.http
        try:
            pairs: dict[int, list[dict[str, dict]]] = {c: [] for c in levels}
            for r in range(args.rounds):
                for c in levels:
                    order = ("python", "perf_analyzer") if (r + c) % 2 == 0 else ("perf_analyzer", "python")
                    pair = {}
                    for engine in order:
                        got = measure(engine, url, args.model, c, args, Path(tmp) / "out.csv")
                        if got is not None:
                            pair[engine] = got
                            print(f"  round {r + 1} c={c} {engine}: {got['Inferences/Second']:.1f} infer/s, "
                                  f"p50 {got['p50 latency']:.0f} us", file=sys.stderr)
                    if len(pair) == 2:
                        pairs[c].append(pair)
        finally:
            if server is not None:
                server.stop()
    pinned = ", server and clients on separate CPUs" if args.pin else ""
    print(f"\n{args.model} over HTTP (binary tensors), {args.interval_ms} ms windows{pinned}, {args.rounds} rounds of "
          f"back-to-back runs; medians, and the median of the per-round ratios tritond perf / perf_analyzer\n")
    head = " | ".join(f"perf_analyzer {n} | tritond perf {n} | ratio" for n in ("infer/s", "p50 us", "p99 us"))
    print(f"| conc | {head} |")
    print("|---:|" + "---:|" * 9)
    for c in levels:
        if not pairs[c]:
            print(f"| {c} | no complete round |" + " |" * 8)
            continue
        cells = []
        for k in FIGURES:
            pa = statistics.median(x["perf_analyzer"][k] for x in pairs[c])
            ours = statistics.median(x["python"][k] for x in pairs[c])
            ratio = statistics.median(x["python"][k] / x["perf_analyzer"][k] for x in pairs[c])
            cells += [f"{pa:,.1f}", f"{ours:,.1f}", f"{ratio:.2f}"]
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
