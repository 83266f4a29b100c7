#!/usr/bin/env python3
"""Reload benchmark: does a model that is reloaded under load fail any request, and what do
reloads cost in latency? Run against tritond and, in the same run, real Triton (its Python
backend, explicit model control) with the same repository, model and procedure.

  1. Reloads under load: 16 closed-loop HTTP clients (binary tensors, [1,16] FP32) for 30 s
     against a Python model that is reloaded every 3 s through the repository API, its
     config alternating between two variants (instance count, batching delay, a parameter),
     and once with a broken config (that load must fail and the loaded version keep
     serving). Reported: requests, failed requests, p50/p99 in steady state and during
     reloads (requests that started between a load call and 0.5 s after it returned).
  2. First request after a load: a model whose first execution in a process takes an extra
     300 ms (a cold start: lazy init, JIT, allocator), loaded without and with a
     `model_warmup` sample; the latency of the first request after the load returned
     against the median of the next 30 (steady state), medians over --trials loads. Goal:
     within 1.5x with warmup. For scale, the same model's request after 1 s without traffic
     (the idle reference): a request that wakes an idle server costs more anyway.

  python perf/bench_reload.py                                  # tritond only
  python perf/bench_reload.py --triton-dir /tmp/anchors        # and Triton 2.51 (run_anchors.sh's ANCHORS_DIR)
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tritond.perf import loadgen
from anchors import Triton
from bench_core import ROOT, Server

MODEL_SOURCE = ROOT / "tests" / "fixtures" / "fault_model.py"
MODEL = "reloaded"
VARIANTS = [(1, 0, 1), (2, 200, 2)]            # (instance count, max_queue_delay_microseconds, tag)
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
parameters {{ key: "tag" value: {{ string_value: "{tag}" }} }}
parameters {{ key: "cold_ms" value: {{ string_value: "{cold}" }} }}
{extra}"""
WARMUP = ('model_warmup [ { name: "first_contact" batch_size: 1 inputs { key: "INPUT0" '
          'value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]')
BROKEN = "max_batch_size: many\n"
COLD_MS = 300
DURING_TAIL_S = 0.5


def write_model(repo: Path, name: str, count: int, delay: int, tag: int, cold: int = 0, extra: str = "",
                broken: bool = False) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MODEL_SOURCE, repo / name / "1" / "model.py")
    text = CONFIG.format(name=name, count=count, delay=delay, tag=tag, cold=cold, extra=extra)
    (repo / name / "config.pbtxt").write_text(text + (BROKEN if broken else ""))


def build(repo: Path) -> None:
    write_model(repo, MODEL, *VARIANTS[0])
    write_model(repo, "cold", 1, 0, 0, cold=COLD_MS)
    write_model(repo, "warmed", 1, 0, 0, cold=COLD_MS, extra=WARMUP)


# ---------------------------------------------------------------------- servers

# ---------------------------------------------------------------------- 1. reloads under load

@dataclass
class Reloads:
    windows: list[tuple[float, float]] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)


def reload_loop(http: str, repo: Path, start: float, duration: float, every: float, broken_at: int,
                out: Reloads) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(http, network_timeout=120)
    k = 0
    while True:
        at = start + every / 2 + k * every
        if at > start + duration - 1.0:
            break
        time.sleep(max(0.0, at - time.perf_counter()))
        count, delay, tag = VARIANTS[(k + 1) % 2]
        write_model(repo, MODEL, count, delay, tag + 10 * k, broken=(k == broken_at))
        t0 = time.perf_counter()
        try:
            client.load_model(MODEL)
            out.outcomes.append("ok")
        except InferenceServerException as e:
            out.outcomes.append(f"failed ({e.status()}: {e.message().strip()[:80]})")
        out.windows.append((t0, time.perf_counter()))
        k += 1
    client.close()


async def traffic(http: str, clients: int, duration: float, warmup: float) -> tuple[list, float]:
    """(begin, end, error) per request after `warmup`; and the measured window's start."""
    host, port = loadgen.split_target(http)
    request = loadgen.http_request(host, port, MODEL, [loadgen.make_input("INPUT0", (1, 16), "FP32")], True)
    conns = [loadgen.HttpConnection(host, port) for _ in range(clients)]
    records: list[tuple[float, float, str]] = []
    window = time.perf_counter() + warmup
    end = window + duration

    async def worker(conn: loadgen.HttpConnection) -> None:
        while (begin := time.perf_counter()) < end:
            try:
                status, body = await conn.send(request)
                error = "" if status == 200 else f"HTTP {status}: {body[:120].decode(errors='replace')}"
            except Exception as e:        # a dropped connection is a failed request too
                error = f"{type(e).__name__}: {e}"
            if begin >= window:
                records.append((begin, time.perf_counter(), error))
            if error:
                await asyncio.sleep(0.01)

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()
    return records, window


def percentiles(ms: list[float]) -> str:
    if not ms:
        return "- / -"
    p50, p99 = np.percentile(ms, [50, 99])
    return f"{p50:.2f} / {p99:.2f}"


def under_load(http: str, repo: Path, args: argparse.Namespace) -> dict:
    reloads = Reloads()
    start = time.perf_counter() + args.warmup
    thread = threading.Thread(target=reload_loop, args=(http, repo, start, args.duration, args.every, 4, reloads))
    thread.start()
    records, _ = asyncio.run(traffic(http, args.clients, args.duration, args.warmup))
    thread.join()
    write_model(repo, MODEL, *VARIANTS[0])
    during, steady, errors = [], [], []
    for begin, end, error in records:
        if error:
            errors.append(error)
            continue
        near = any(t0 <= begin <= t1 + DURING_TAIL_S for t0, t1 in reloads.windows)
        (during if near else steady).append((end - begin) * 1e3)
    return {"requests": len(records), "failed": len(errors), "errors": errors[:3], "steady": steady,
            "during": during, "reloads": reloads.outcomes,
            "reload_s": [t1 - t0 for t0, t1 in reloads.windows]}


# ---------------------------------------------------------------------- 2. first request after a load

def first_request(http: str, trials: int) -> dict[str, tuple[float, float, float]]:
    """Per model, medians over `trials` loads of: the first request after the load returned,
    the steady state (median of the next 30), and an idle reference: the same, now warm,
    model's request after 1 s without traffic (what waking an idle server costs anyway)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http, network_timeout=120)
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.ones((1, 16), np.float32))

    def timed(model: str) -> float:
        t0 = time.perf_counter()
        client.infer(model, [inp])
        return (time.perf_counter() - t0) * 1e3

    out = {}
    for model in ("cold", "warmed"):
        firsts, steadies, idles = [], [], []
        for _ in range(trials):
            client.unload_model(model)
            time.sleep(1.0)
            client.load_model(model)
            firsts.append(timed(model))
            steadies.append(statistics.median(timed(model) for _ in range(30)))
            time.sleep(1.0)
            idles.append(timed(model))
        out[model] = (statistics.median(firsts), statistics.median(steadies), statistics.median(idles))
    client.close()
    return out


# ---------------------------------------------------------------------- driver

def run_server(kind: str, args: argparse.Namespace, tmp: Path) -> tuple[dict, dict]:
    repo = tmp / kind / "models"
    build(repo)
    models = [f"--load-model={m}" for m in (MODEL, "cold", "warmed")]
    if kind == "tritond":
        server = Server(repo, tmp / "tritond.log", ["--model-control-mode=explicit", *models])
        http = server.http
    else:
        server = Triton(Path(args.triton_dir), repo, tmp / "triton.log", ["--model-control-mode=explicit", *models])
        http = server.http
    try:
        server.wait_ready(180)
        print(f"[{kind}] reloads under load ({args.clients} clients, {args.duration:g} s) ...", file=sys.stderr)
        load = under_load(http, repo, args)
        print(f"[{kind}] first request after a load ...", file=sys.stderr)
        first = first_request(http, args.trials)
    finally:
        server.stop()
    return load, first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--triton-dir", help="ANCHORS_DIR of /work/shared/bench-anchors/run_anchors.sh (Triton 2.51)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--every", type=float, default=3.0, help="seconds between reloads")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--trials", type=int, default=10, help="loads per model for the first-request figures")
    args = p.parse_args()
    kinds = ["tritond"] + (["triton"] if args.triton_dir else [])
    tmp = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    results = {k: run_server(k, args, tmp) for k in kinds}
    print(f"\nReloads under load: {args.clients} clients, {args.duration:g} s, a reload every {args.every:g} s "
          f"(the 5th with a broken config)\n")
    print("| server | requests | failed | p50 / p99 ms steady | p50 / p99 ms during reloads | reloads | reload call s (median) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for kind, (load, _) in results.items():
        outcomes = f"{load['reloads'].count('ok')} ok, " + "; ".join(o for o in load["reloads"] if o != "ok")
        print(f"| {kind} | {load['requests']} | {load['failed']} | {percentiles(load['steady'])} "
              f"| {percentiles(load['during'])} | {outcomes} | {statistics.median(load['reload_s']):.2f} |")
    for kind, (load, _) in results.items():
        if load["errors"]:
            print(f"\n{kind} errors, first {len(load['errors'])}: {load['errors']}")
    print(f"\nFirst request after a load (a {COLD_MS} ms cold start in the model's first execution)\n")
    print("| server | model | first request ms | steady ms | idle reference ms | first / steady | first / idle |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, (_, first) in results.items():
        for model, (f, st, idle) in first.items():
            label = "with model_warmup" if model == "warmed" else "without warmup"
            print(f"| {kind} | {label} | {f:.2f} | {st:.2f} | {idle:.2f} | {f / st:.2f} | {f / idle:.2f} |")
    print(f"\n(medians over {args.trials} loads; idle reference: the warm model's request after 1 s without traffic)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
