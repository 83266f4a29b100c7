#!/usr/bin/env python3
"""Chaos run: closed-loop clients on a two-instance model while a worker is killed on a timer.

Starts tritond on a generated repository (model `chaos`: Python identity, two instances,
dynamic batching; model `bystander`: one instance, never killed), runs --clients HTTP
clients for --duration seconds and SIGKILLs one `chaos` worker every --interval seconds,
each time only once both instances are serving again. Prints:

- requests sent, succeeded, failed (and failures whose message is not the killed batch's);
- per kill: the requests the broker had inside the killed worker (from its log line) against
  the client-side failures that kill caused;
- time from the kill to the replacement being READY, from polling /metrics
  (`tritond_model_restart_count` up by one and `tritond_model_ready_instances` back to 2);
- request latency p50/p99 overall and during kills (requests in flight at some moment between
  a kill and its replacement being READY), and answers whose output is not their input;
- with --idempotent (the `chaos` model sets `idempotent`), the requests run again and those
  that failed after a retry, from the broker's log and /metrics;
- shared-memory segments of dead processes while running and of the server after it stops.

  python perf/chaos.py [--clients 16] [--duration 20] [--interval 2] [--sleep-ms 0] [--idempotent]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench_core import ROOT, Server, ServerStartError

from tritond.perf import loadgen

sys.path.insert(0, str(ROOT / "tests"))
from conftest import worker_title  # noqa: E402  (the tests' helpers, shared)
from fault_models import add_fault_model  # noqa: E402

KILL_LOG = re.compile(r"model 'chaos' instance '[^']+' \(pid (\d+)\) died \(killed by signal 9 \(SIGKILL\)\); "
                      r"its batch held (\d+) request\(s\): (\d+) failed, (\d+) retried")


@dataclass
class Kill:
    pid: int
    at: float
    recovered_at: float = 0.0
    inside: int = -1               # requests the broker had inside the worker (its log)
    retried: int = 0               # of those, the ones run again (idempotent)
    failed: int = 0                # client failures caused by this kill


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: list[tuple[float, str]] = field(default_factory=list)   # (when, message)
    spans: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered) of each success
    wrong: int = 0                 # answers whose OUTPUT0 is not the input
    retry_counts: dict[str, float] = field(default_factory=dict)    # the broker's retry counters at the end


def build(repo: Path, sleep_ms: float, idempotent: bool) -> None:
    for name, count in (("chaos", 2), ("bystander", 1)):
        params: dict[str, object] = {"sleep_ms": sleep_ms}
        if idempotent and name == "chaos":
            params["idempotent"] = "true"
        add_fault_model(repo, name, count=count, max_batch=16, dims="16", params=params)


def worker_pids(server_id: str, model: str) -> list[int]:
    """Workers of `model` of this server, by their process title."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()
            and (t := worker_title(int(e))) is not None and t.get("server") == server_id and t.get("model") == model]


def stale_segments(server_id: str) -> list[str]:
    """Segments of this server whose owner process (w<pid> / f<pid>) is gone."""
    out = []
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"tritond.{server_id}."):
            owner = name.split(".")[2]
            if not os.path.exists(f"/proc/{owner[1:]}"):
                out.append(name)
    return out


class Metrics:
    def __init__(self, port: int) -> None:
        self.conn = loadgen.HttpConnection("127.0.0.1", port)
        self.request = f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()

    async def read(self, model: str) -> dict[str, float]:
        status, body = await self.conn.send(self.request)
        out = {}
        for line in body.decode().splitlines():
            if line.startswith(("tritond_model_", "tritond_inference_request_retry")) and f'model="{model}"' in line:
                out[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
        return out


async def client(i: int, host: str, port: int, stop: asyncio.Event, tally: Tally) -> None:
    conn = loadgen.HttpConnection(host, port)
    data = np.arange(16, dtype=np.float32).tolist()
    k = 0
    while not stop.is_set():
        body = json.dumps({"id": f"c{i}-{k}", "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data}]}).encode()
        request = (f"POST /v2/models/chaos/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        k += 1
        tally.sent += 1
        sent = time.monotonic()
        try:
            status, reply = await conn.send(request)
        except (OSError, asyncio.IncompleteReadError) as e:
            tally.failed.append((time.monotonic(), f"connection error: {e}"))
            continue
        if status == 200:
            tally.ok += 1
            tally.spans.append((sent, time.monotonic()))
            out = next(o for o in json.loads(reply)["outputs"] if o["name"] == "OUTPUT0")
            if out["data"] != data:
                tally.wrong += 1
        else:
            tally.failed.append((time.monotonic(), f"{status} {json.loads(reply).get('error', '')}"))
    conn.close()


async def killer(server: Server, server_id: str, metrics: Metrics, args, stop: asyncio.Event,
                 kills: list[Kill]) -> None:
    """Kill a chaos worker every interval (once both instances serve), and time recoveries."""
    rng = random.Random(0)
    next_kill = time.monotonic() + args.interval
    while not stop.is_set():
        await asyncio.sleep(max(0.0, next_kill - time.monotonic()))
        if stop.is_set():
            return
        m = await metrics.read("chaos")
        if m.get("tritond_model_ready_instances") != 2:
            await asyncio.sleep(0.02)
            continue
        pids = worker_pids(server_id, "chaos")
        victim = rng.choice(pids)
        restarts = m["tritond_model_restart_count"]
        os.kill(victim, signal.SIGKILL)
        kill = Kill(victim, time.monotonic())
        kills.append(kill)
        next_kill = kill.at + args.interval
        while True:
            m = await metrics.read("chaos")
            if m["tritond_model_restart_count"] > restarts and m["tritond_model_ready_instances"] == 2:
                kill.recovered_at = time.monotonic()
                break
            await asyncio.sleep(0.01)


async def run(server: Server, server_id: str, args) -> tuple[Tally, list[Kill], list[str]]:
    host, port = loadgen.split_target(server.http)
    metrics = Metrics(int(server.proc.args[server.proc.args.index("--metrics-port") + 1]))
    stop = asyncio.Event()
    tally = Tally()
    kills: list[Kill] = []
    clients = [asyncio.create_task(client(i, host, port, stop, tally)) for i in range(args.clients)]
    chaos = asyncio.create_task(killer(server, server_id, metrics, args, stop, kills))
    await asyncio.sleep(args.duration)
    stop.set()
    await asyncio.gather(*clients)
    await chaos
    tally.retry_counts = {k: v for k, v in (await metrics.read("chaos")).items() if "retry" in k}
    stale = stale_segments(server_id)
    metrics.conn.close()
    return tally, kills, stale


def attribute(tally: Tally, kills: list[Kill], log: str) -> int:
    """Fill in each kill's inside/failed counts; return failures not caused by a killed batch."""
    inside = {int(pid): (int(n), int(again)) for pid, n, _, again in KILL_LOG.findall(log)}
    for k in kills:
        k.inside, k.retried = inside.get(k.pid, (-1, 0))
    outside = 0
    for when, message in tally.failed:
        owner = [k for k in kills if k.at <= when]
        if owner and "'chaos'" in message and "died (killed by signal 9" in message:
            owner[-1].failed += 1
        else:
            outside += 1
    return outside


def latencies(tally: Tally, kills: list[Kill]) -> tuple[np.ndarray, np.ndarray]:
    """Latencies (ms) of every success, and of those in flight during a kill's recovery."""
    windows = [(k.at, k.recovered_at or float("inf")) for k in kills]
    every = np.array([end - sent for sent, end in tally.spans]) * 1e3
    during = np.array([end - sent for sent, end in tally.spans
                       if any(sent <= w_end and end >= w_at for w_at, w_end in windows)]) * 1e3
    return every, during


def percentiles(ms: np.ndarray) -> str:
    if not len(ms):
        return "none"
    return f"p50 {np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms (n={len(ms)})"


def report(tally: Tally, kills: list[Kill], outside: int, stale: list[str], leaked: list[str], args) -> str:
    recoveries = np.array([k.recovered_at - k.at for k in kills if k.recovered_at]) * 1e3
    p50, worst = (float(np.percentile(recoveries, 50)), float(recoveries.max())) if len(recoveries) else (0.0, 0.0)
    every, during = latencies(tally, kills)
    counts = tally.retry_counts
    lines = [
        f"chaos: {args.clients} clients, {args.duration:g} s, a 'chaos' worker SIGKILLed every {args.interval:g} s "
        f"(model sleeps {args.sleep_ms:g} ms per batch{', idempotent' if args.idempotent else ''})",
        f"requests sent {tally.sent}, succeeded {tally.ok}, failed {len(tally.failed)} "
        f"({outside} outside a killed batch), wrong answers {tally.wrong}",
        f"kills {len(kills)}: requests inside the killed worker {sum(max(k.inside, 0) for k in kills)}, "
        f"run again {sum(k.retried for k in kills)}, client failures from kills {sum(k.failed for k in kills)}",
        "  per kill (inside/retried/failed): " + ", ".join(f"{k.inside}/{k.retried}/{k.failed}" for k in kills),
        f"retry counters: tritond_inference_request_retry {counts.get('tritond_inference_request_retry', 0):g}, "
        f"tritond_inference_request_retry_failure {counts.get('tritond_inference_request_retry_failure', 0):g}",
        f"latency: all {percentiles(every)}; during kills {percentiles(during)}",
        f"kill -> replacement READY: p50 {p50:.0f} ms, max {worst:.0f} ms (over {len(recoveries)} kills)",
        f"stale segments of dead processes while running: {len(stale)}; segments left after stop: {len(leaked)}",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between kills")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="time the model spends per batch")
    p.add_argument("--idempotent", action="store_true", help="the chaos model sets 'idempotent': killed batches "
                                                              "run again")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
        repo = Path(tmp) / "models"
        build(repo, args.sleep_ms, args.idempotent)
        server = Server(repo, Path(tmp) / "tritond.log")
        try:
            server.wait_ready(120)
            server_id = re.search(r"server id ([0-9a-f]{32})", server.log_path.read_text()).group(1)
            tally, kills, stale = asyncio.run(run(server, server_id, args))
        except ServerStartError as e:
            sys.exit(str(e))
        finally:
            server.stop()
        log = server.log_path.read_text(errors="replace")
        leaked = [n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{server_id}.")]
    outside = attribute(tally, kills, log)
    print(report(tally, kills, outside, stale, leaked, args))


if __name__ == "__main__":
    main()
