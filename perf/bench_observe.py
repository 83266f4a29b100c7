#!/usr/bin/env python3
"""What observability and the response cache cost (or gain), measured in one run.

identity_fp32 (16 FP32) and mlp_onnx ([1,256] FP32), HTTP binary, closed loop at one
concurrency (default 16), each ratio against case (a) of the same round:
  (a) everything off
  (b) /metrics scraped every 100 ms meanwhile
  (c) Triton-mode tracing (TIMESTAMPS) at rate 100 and at rate 1, set through the settings API
  (d) --cache-config local,size=64 MiB with 100% hits (one request repeated) and 0% hits
      (every request's last input element is a counter)
Goals (README): (b) and (c, rate 100) cost < 3%, (d) 0% hits < 5%, (d) 100% hits >= 2x (a)
for the MLP. Rounds alternate the servers; the table shows the median over rounds.

  python perf/bench_observe.py --rounds 2 --duration 4
  python perf/bench_observe.py --triton 127.0.0.1:18000   # also the cache cases against a
      # running tritonserver (bench-anchors) started with --cache-config local,size=67108864
      # and response_cache enabled in its identity_fp32 / mlp_onnx_py configs
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tritond.perf import loadgen
from bench_core import READY_TIMEOUT_S, Server, build_repository

MODELS = {"identity": ("identity_fp32", (16,)), "mlp": ("mlp_onnx", (1, 256))}
CACHE_BYTES = 64 << 20


async def _run(target: str, model: str, shape: tuple, conc: int, duration: float, warmup: float,
               unique: bool) -> loadgen.Result:
    host, port = loadgen.split_target(target)
    inp = loadgen.make_input("INPUT0", shape, "FP32")
    base = loadgen.http_request(host, port, model, [inp], True)
    conns = [loadgen.HttpConnection(host, port) for _ in range(conc)]
    counter = [0]

    def sender(conn: loadgen.HttpConnection):
        async def send() -> None:
            request = base
            if unique:      # a distinct last element: no two requests share a cache key
                counter[0] += 1
                request = base[:-4] + struct.pack("<f", float(counter[0]))
            status, body = await conn.send(request)
            if status != 200:
                raise loadgen.RequestFailed(f"HTTP {status}: {body[:200]!r}")
        return send

    senders = [sender(c) for c in conns]
    try:
        await senders[0]()
        return await loadgen.closed_loop(senders, warmup, duration, 30.0)
    finally:
        for c in conns:
            c.close()


def measure(target: str, key: str, args: argparse.Namespace, unique: bool = False) -> float:
    model, shape = MODELS[key]
    if key == "mlp" and args.triton_mlp and target == args.triton:
        model = args.triton_mlp
    r = asyncio.run(_run(target, model, shape, args.concurrency, args.duration, args.warmup, unique))
    if r.errors:
        raise SystemExit(f"{r.errors} errors measuring {key} on {target}")
    return r.infer_per_s


class Scraper:
    """GET /metrics every `interval` seconds while a case runs."""

    def __init__(self, port: int, interval: float) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.wait(self.interval):
            with urllib.request.urlopen(self.url, timeout=5) as r:
                r.read()
            self.count += 1

    def __enter__(self) -> "Scraper":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def trace(http: str, settings: dict) -> None:
    req = urllib.request.Request(f"http://{http}/v2/trace/setting", json.dumps(settings).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def metrics_port(server: Server) -> int:
    argv = server.proc.args
    return int(argv[argv.index("--metrics-port") + 1])


def one_round(repo: Path, tmp: Path, args: argparse.Namespace, results: dict) -> None:
    plain = Server(repo, tmp / "plain.log", ["--allow-grpc=false", f"--trace-config=triton,file={tmp / 'trace.json'}",
                                             "--trace-config=triton,log-frequency=1000"])
    try:
        plain.wait_ready(READY_TIMEOUT_S)
        for key in MODELS:
            results.setdefault((key, "a"), []).append(measure(plain.http, key, args))
            with Scraper(metrics_port(plain), 0.1):
                results.setdefault((key, "b"), []).append(measure(plain.http, key, args))
            for rate in (100, 1):
                trace(plain.http, {"trace_level": ["TIMESTAMPS"], "trace_rate": str(rate)})
                results.setdefault((key, f"c{rate}"), []).append(measure(plain.http, key, args))
                trace(plain.http, {"trace_level": ["OFF"]})
    finally:
        plain.stop()
    cached = Server(repo, tmp / "cached.log", ["--allow-grpc=false", f"--cache-config=local,size={CACHE_BYTES}"])
    try:
        cached.wait_ready(READY_TIMEOUT_S)
        for key in MODELS:
            results.setdefault((key, "hit"), []).append(measure(cached.http, key, args))
            results.setdefault((key, "miss"), []).append(measure(cached.http, key, args, unique=True))
    finally:
        cached.stop()
    if args.triton:
        for key in MODELS:
            results.setdefault((key, "triton-hit"), []).append(measure(args.triton, key, args))
            results.setdefault((key, "triton-miss"), []).append(measure(args.triton, key, args, unique=True))


LABELS = {"a": "(a) everything off", "b": "(b) /metrics every 100 ms", "c100": "(c) tracing, rate 100",
          "c1": "(c) tracing, rate 1", "hit": "(d) cache, 100% hits", "miss": "(d) cache, 0% hits",
          "triton-hit": "Triton, cache, 100% hits", "triton-miss": "Triton, cache, 0% hits"}


def render(results: dict, args: argparse.Namespace) -> str:
    rows = [f"c={args.concurrency}, HTTP binary, {args.rounds} round(s) of {args.duration:g} s, median infer/s",
            "", "| case | identity infer/s | x (a) | mlp infer/s | x (a) |", "|---|---:|---:|---:|---:|"]
    for case, label in LABELS.items():
        if (("identity", case)) not in results:
            continue
        cells = []
        for key in MODELS:
            v = statistics.median(results[(key, case)])
            base = statistics.median(results[(key, "a")])
            cells += [f"{v:,.0f}", f"{v / base:.3f}"]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    if (("identity", "triton-hit")) in results:
        rows.append("")
        for key in MODELS:
            for case in ("hit", "miss"):
                ours = statistics.median(results[(key, case)])
                theirs = statistics.median(results[(key, f"triton-{case}")])
                rows.append(f"{key}, cache {case}: tritond / Triton = {ours / theirs:.2f}")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--triton", default="", help="host:port of a tritonserver with the cache on (HTTP)")
    p.add_argument("--triton-mlp", default="mlp_onnx_py", help="the MLP's name in that server")
    args = p.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_observe_") as name:
        tmp = Path(name)
        repo = tmp / "models"
        build_repository(repo, ["identity_fp32", "mlp_onnx"])
        for model in ("identity_fp32", "mlp_onnx"):
            with open(repo / model / "config.pbtxt", "a") as f:
                f.write("\nresponse_cache { enable: true }\n")
        for _ in range(args.rounds):
            one_round(repo, tmp, args, results)
            time.sleep(0.5)
    print(render(results, args))


if __name__ == "__main__":
    main()
