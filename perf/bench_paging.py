#!/usr/bin/env python3
"""Model paging: N models under a budget that holds B of them, Zipf traffic at concurrency C,
against the same host with every model resident (where they fit) and, optionally, real Triton
with every model loaded.

A repository of N small models (half ONNX: a 16x16 MatMul; half Python: identity), one CPU
instance each. Runs, one server at a time:
- tritond paged (--model-control-mode=paged, budget = the server's own processes + B x one model's
  measured size, both measured by a calibration server);
- tritond with every model resident (--model-control-mode=none): all N when their measured size
  fits in --resident-limit of the host's available memory (and --resident-models allows), else
  the M that do, under the same Zipf traffic over those M;
- with --triton-anchors: real Triton loading the same repository (its Python backend only: the
  ONNX models through a model.py running onnxruntime), its time to READY and memory.
For each tritond run: throughput, latency p50/p99 of all requests and of the requests to the
most popular models (resident under paging too, so comparable across runs), the server's own
page-in-to-first-response p50/p99, and the process tree's PSS sampled every 0.5 s (min/mean/max).

  python perf/bench_paging.py                                  # 1000 models, budget for 50, c=16
  python perf/bench_paging.py --models 200 --budget-models 20 --duration 20
  python perf/bench_paging.py --triton-anchors /tmp/anchors --triton-models 100
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench_density import build, cmdline, free_port, memory, wait_ready
from tritond.frontend.metrics import tree

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
READY_TIMEOUT_S = 900.0
HOT = 10                    # the most popular models: their latency is compared across runs
COLD = 20                   # the least popular models, asked for one at a time: page-in latency alone


@dataclass
class Run:
    name: str
    models: int
    ready_s: float = 0.0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)        # ms
    hot: list[float] = field(default_factory=list)              # ms, the HOT most popular models
    pss: list[int] = field(default_factory=list)                # the process tree's, sampled
    workers: list[int] = field(default_factory=list)            # the model workers' alone, sampled
    page_in: tuple[float, float] | None = None                  # server's p50, p99 ms
    resident: list[float] = field(default_factory=list)         # ms, traffic over the HOT models only
    resident_rate: float = 0.0
    cold: list[float] = field(default_factory=list)             # ms, one client, one cold model after another
    page_ins: int = 0
    budget: int = 0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    want = "".join(f'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    m = re.search(rf"^{name}{{{want}[^}}]*}} (\S+)$" if labels else rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def tree_pss(root: int) -> tuple[int, int]:
    """PSS of the whole process tree, and of its model workers."""
    total = workers = 0
    for pid in tree(root):
        pss = memory(pid)[0]
        total += pss
        if cmdline(pid).startswith("tritond-worker"):
            workers += pss
    return total, workers


class Server:
    def __init__(self, repo: Path, args: list[str], log: Path) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "tritond.cli", "start", "--model-repository", str(repo),
               "--http-port", str(self.port), "--grpc-port", str(free_port()),
               "--metrics-port", str(self.metrics_port), *args]
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=str(ROOT))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()


def infer_once(client, name: str) -> None:
    import tritonclient.http as httpclient
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.ones((1, 16), np.float32))
    client.infer(name, [inp])


def model_size(tmp: Path, resident: int) -> tuple[int, int]:
    """What one model's workers take with `resident` models in (a forked worker's PSS includes its
    share of the template's pages, so it shrinks as more share them), and what the server's own
    processes take beside them, measured by a paged server."""
    repo = tmp / "calibrate"
    names = build(repo, "onnx", resident // 2) + build(repo, "python", resident - resident // 2)
    server = Server(repo, ["--model-control-mode=paged", f"--model-memory-budget={1 << 40}"], tmp / "calibrate.log")
    try:
        wait_ready(server.port, server.proc, READY_TIMEOUT_S, server.log)
        import tritonclient.http as httpclient
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=120)
        for name in names:
            infer_once(client, name)
        client.close()
        for _ in range(100):
            text = scrape(server.metrics_port)
            sizes = [sample(text, "tritond_model_memory_bytes", model=m) or 0 for m in names]
            if all(sizes):
                return int(sum(sizes) / len(sizes)), int(sample(text, "tritond_server_memory_bytes") or 0)
            time.sleep(0.2)
        raise RuntimeError("the calibration server never measured its models")
    finally:
        server.stop()


def zipf_plan(names: list[str], s: float, seed: int) -> tuple[list[str], list[float]]:
    """The models in popularity order (shuffled against their names) and their weights."""
    order = random.Random(seed).sample(names, len(names))
    return order, [1.0 / (rank + 1) ** s for rank in range(len(order))]


def drive(run: Run, port: int, root_pid: int, order: list[str], weights: list[float], concurrency: int,
          duration: float, seed: int) -> None:
    """Closed-loop Zipf traffic from `concurrency` clients for `duration` s, PSS sampled meanwhile."""
    import tritonclient.http as httpclient
    hot = set(order[:HOT])
    stop = threading.Event()
    lock = threading.Lock()

    def client(n: int) -> None:
        rng = random.Random(seed + n)
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=300)
        while not stop.is_set():
            name = rng.choices(order, weights)[0]
            t0 = time.perf_counter()
            try:
                infer_once(c, name)
                ok = True
            except Exception:       # noqa: BLE001 -- counted as an error
                ok = False
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                run.requests += 1
                if not ok:
                    run.errors += 1
                    continue
                run.latencies.append(ms)
                if name in hot:
                    run.hot.append(ms)
        c.close()

    def sampler() -> None:
        while not stop.wait(0.5):
            total, workers = tree_pss(root_pid)
            run.pss.append(total)
            run.workers.append(workers)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(concurrency)]
    watcher = threading.Thread(target=sampler)
    t0 = time.monotonic()
    watcher.start()
    for t in threads:
        t.start()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join(600)
    run.seconds = time.monotonic() - t0
    watcher.join(10)


def cold_requests(port: int, names: list[str]) -> list[float]:
    """One client asks for each of `names` in turn (models paged out, with the budget full):
    the latency of a page-in with nothing else going on, ms."""
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=300)
    out = []
    for name in names:
        t0 = time.perf_counter()
        infer_once(client, name)
        out.append((time.perf_counter() - t0) * 1000)
    client.close()
    return out


def run_tritond(name: str, repo: Path, names: list[str], args: list[str], ns: argparse.Namespace, tmp: Path,
                budget: int = 0) -> Run:
    run = Run(name, len(names), budget=budget)
    server = Server(repo, args, tmp / f"{name.replace(' ', '_')}.log")
    try:
        run.ready_s = wait_ready(server.port, server.proc, READY_TIMEOUT_S, server.log)
        order, weights = zipf_plan(names, ns.zipf, ns.seed)
        drive(run, server.port, server.proc.pid, order, weights, ns.concurrency, ns.duration, ns.seed)
        hot = Run("hot", HOT)       # the same clients over the HOT models only: resident in every run
        drive(hot, server.port, server.proc.pid, order[:HOT], [1.0] * HOT, ns.concurrency, ns.duration / 2, ns.seed)
        run.resident, run.resident_rate = hot.latencies, hot.requests / hot.seconds
        if budget:
            run.cold = cold_requests(server.port, order[-COLD:])
        text = scrape(server.metrics_port)
        p50 = sample(text, "tritond_page_in_first_response_us", quantile="0.5")
        p99 = sample(text, "tritond_page_in_first_response_us", quantile="0.99")
        if p50 is not None and p99 is not None and p50 == p50:      # NaN: no page-in
            run.page_in = (p50 / 1000, p99 / 1000)
        run.page_ins = int(sample(text, "tritond_page_in_first_response_us_count") or 0)
    finally:
        server.stop()
    return run


def run_triton(anchors: Path, n: int, tmp: Path) -> Run:
    from anchors import Triton
    run = Run("Triton 2.51, every model loaded (python backend)", n)
    repo = tmp / "triton_models"
    build(repo, "onnx", n // 2, for_triton=True)
    build(repo, "python", n - n // 2)
    triton = Triton(anchors, repo, tmp / "triton.log", ["--allow-metrics=false"])
    try:
        run.ready_s = wait_ready(int(triton.http.rsplit(":", 1)[1]), triton.proc, READY_TIMEOUT_S, triton.log_path)
        time.sleep(1.0)
        run.pss.append(tree_pss(triton.proc.pid)[0])
    finally:
        triton.stop()
    return run


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=1000, help="models in the repository (half ONNX, half Python)")
    p.add_argument("--budget-models", type=int, default=50, help="the budget, in models of the measured size")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of traffic per run")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the models' popularity")
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--resident-limit", type=float, default=0.6,
                   help="every-model-resident loads at most the models that fit in this share of available memory")
    p.add_argument("--resident-models", type=int, default=0,
                   help="every-model-resident loads at most this many models (0: as many as fit, up to N)")
    p.add_argument("--triton-anchors", type=Path, help="ANCHORS_DIR prepared by bench-anchors/run_anchors.sh")
    p.add_argument("--triton-models", type=int, default=100, help="models real Triton loads (memory permitting)")
    ns = p.parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="paging-") as tmp_name:
        tmp = Path(tmp_name)
        size, base = model_size(tmp, ns.budget_models)
        repo = tmp / "models"
        names = build(repo, "onnx", ns.models // 2) + build(repo, "python", ns.models - ns.models // 2)
        budget = base + ns.budget_models * size
        print(f"one model: {size / MB:.1f} MB PSS, the server's own processes {base / MB:.0f} MB; budget "
              f"{budget / MB:.0f} MB (the server and {ns.budget_models} models)", file=sys.stderr, flush=True)
        runs.append(run_tritond("tritond paged", repo, names,
                                ["--model-control-mode=paged", f"--model-memory-budget={budget}"], ns, tmp, budget))
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        fits = int(ns.resident_limit * available // size)
        m = min(ns.models, fits, ns.resident_models or ns.models)
        if m == ns.models:
            resident_repo, resident_names = repo, names
        else:       # the models that fit (or that were asked for), the same traffic over them
            print(f"every model resident: {m} of {ns.models} ({fits} fit in {ns.resident_limit:.0%} of the "
                  f"{available / MB:.0f} MB available)", file=sys.stderr, flush=True)
            resident_repo = tmp / "resident"
            resident_names = build(resident_repo, "onnx", m // 2) + build(resident_repo, "python", m - m // 2)
        runs.append(run_tritond("tritond all resident", resident_repo, resident_names, ["--model-control-mode=none"],
                                ns, tmp))
        if ns.triton_anchors:
            runs.append(run_triton(ns.triton_anchors, ns.triton_models, tmp))
    print(f"Zipf (s={ns.zipf:g}) over every model, c={ns.concurrency}, {ns.duration:g} s:\n")
    print(f"| server | models | READY s | req/s | errors | p50 ms | p99 ms | top-{HOT} p50 ms | top-{HOT} p99 ms "
          f"| page-ins | page-in p50 ms | page-in p99 ms | PSS min/mean/max MB | workers' PSS max MB | budget MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in runs:
        rate = r.requests / r.seconds if r.seconds else 0.0
        pin = r.page_in or (float("nan"), float("nan"))
        mem = (f"{min(r.pss) / MB:.0f}/{sum(r.pss) / len(r.pss) / MB:.0f}/{max(r.pss) / MB:.0f}" if r.pss else "-")
        print(f"| {r.name} | {r.models} | {r.ready_s:.1f} | {rate:.0f} | {r.errors} | {pct(r.latencies, 50):.2f} "
              f"| {pct(r.latencies, 99):.2f} | {pct(r.hot, 50):.2f} | {pct(r.hot, 99):.2f} | {r.page_ins} "
              f"| {pin[0]:.1f} | {pin[1]:.1f} | {mem} | {max(r.workers, default=0) / MB:.0f} | {r.budget / MB:.0f} |")
    print(f"\nResident models only (the top {HOT}), c={ns.concurrency}, {ns.duration / 2:g} s; and one client "
          f"asking for {COLD} paged-out models in turn (budget full):\n")
    print("| server | resident req/s | resident p50 ms | resident p99 ms | page-in alone p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in runs:
        if r.seconds:
            print(f"| {r.name} | {r.resident_rate:.0f} | {pct(r.resident, 50):.2f} | {pct(r.resident, 99):.2f} "
                  f"| {pct(r.cold, 50):.1f} | {pct(r.cold, 99):.1f} |")
    print("\nPSS is the whole process tree's (supervisor, broker, frontends, templates, workers), sampled every "
          "0.5 s under load, which the budget bounds. Triton's row: after startup, no traffic.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
