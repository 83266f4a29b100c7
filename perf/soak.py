#!/usr/bin/env python3
"""Soak: mixed load on tritond for --minutes while a chaos loop attacks it.

Load (closed loop, asyncio): HTTP JSON clients on `soak` (two instances, dynamic batching),
gRPC clients on `solo` (one instance, so killing it means a restart the requests wait for),
system shared-memory clients on `soak` (inputs and outputs in registered regions, every answer
checked), HTTP clients on the ensemble `pipeline` (soak -> solo), HTTP binary clients of
256 KiB tensors on `large` (through the shared-memory arenas), and one HTTP client on
`reloaded`. Chaos, one action every --chaos-interval seconds in turn: SIGKILL a worker of
soak, solo or large, reload `reloaded` by an explicit load carrying a `config` parameter, open slow
connections (half a head, a stalled body), send malformed HTTP and gRPC requests.

Prints requests served and failed (by kind: inside a killed batch, 4xx, during a reload,
other), what chaos did and how the server answered, RSS and open descriptors of every
process at the start and the end, /dev/shm at the end and after the stop, orphan processes.

  python perf/soak.py --minutes 10            # the closing run
  python perf/soak.py --minutes 0.5 --smoke   # a quick look
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from tritonclient.utils import shared_memory as shm

from tritond.perf import loadgen
from bench_core import ROOT, free_port, is_ready, tritond_argv
from soak_chaos import Chaos, ChaosLog, ProcessTable, orphans, session_processes, shm_usage

sys.path.insert(0, str(ROOT / "tests"))
from fault_models import add_fault_model  # noqa: E402  (the tests' fault model, shared)

DIMS = 16
PIPELINE = f"""name: "pipeline" platform: "ensemble" max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {DIMS} ] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {DIMS} ] }}]
ensemble_scheduling {{ step [
  {{ model_name: "soak" model_version: -1 input_map {{ key: "INPUT0" value: "INPUT0" }}
    output_map {{ key: "OUTPUT0" value: "mid" }} }},
  {{ model_name: "solo" model_version: -1 input_map {{ key: "INPUT0" value: "mid" }}
    output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }}
] }}
"""
RELOADED = {
    "name": "reloaded", "backend": "python", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [DIMS]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [DIMS]}],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    "parameters": {"sleep_ms": {"string_value": "0"}},
}
RELOAD_WORDS = ("unloaded", "being unloaded", "not ready", "not at ready state", "has no available versions",
                "is not found")
LARGE = 64 * 1024          # floats per request of the `large` clients: 256 KiB, through the arenas


def build(repo: Path) -> None:
    add_fault_model(repo, "soak", count=2, max_batch=8, dims=str(DIMS), batching="max_queue_delay_microseconds: 500")
    add_fault_model(repo, "solo", count=1, max_batch=8, dims=str(DIMS), batching="")
    add_fault_model(repo, "reloaded", count=1, max_batch=8, dims=str(DIMS), batching=None)
    add_fault_model(repo, "large", count=1, max_batch=8, dims="-1", batching="")
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(PIPELINE)


@dataclass
class Tally:
    served: int = 0
    failed: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    wrong: int = 0

    def fail(self, kind: str, message: str) -> None:
        self.failed[kind] += 1
        seen = self.examples.setdefault(kind, [])
        if len(seen) < 3 and message not in seen:
            seen.append(message[:200])


def classify(status: int, message: str) -> str:
    if 400 <= status < 500:
        return "4xx"
    if status == 503 and "killed by signal 9" in message:
        return "inside a killed batch"
    if any(word in message for word in RELOAD_WORDS):
        return "during a reload"
    return "other"


GRPC_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
               grpc.StatusCode.UNAVAILABLE: 503}


async def keep_sending(send, tally: Tally, stop: asyncio.Event) -> None:
    """Closed loop: `send()` returns (status, message); a connection the server dropped while
    idle is retried once before it counts."""
    while not stop.is_set():
        for attempt in range(2):
            try:
                status, message = await send()
                break
            except (OSError, asyncio.IncompleteReadError) as e:
                status, message = 0, f"connection error: {e!r}"
                if attempt == 0:
                    continue
        if status == 200:
            tally.served += 1
        else:
            tally.fail(classify(status, message) if status else "connection", f"{status} {message}")
            await asyncio.sleep(loadgen.ERROR_BACKOFF_S)       # as a client would, rather than spin


def http_sender(host: str, port: int, model: str, tally: Tally, size: int = DIMS):
    """JSON requests of `size` floats, or binary ones (tensor extension) above DIMS."""
    conn = loadgen.HttpConnection(host, port)
    inputs = [loadgen.make_input("INPUT0", [1, size], "FP32")]
    request = loadgen.http_request(host, port, model, inputs, size > DIMS)

    async def send() -> tuple[int, str]:
        status, body = await conn.send(request)
        return status, "" if status == 200 else json.loads(body or b"{}").get("error", "")
    return send


def grpc_sender(target: str, model: str):
    channel = grpc.aio.insecure_channel(target)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    request = loadgen.grpc_request(model, [loadgen.make_input("INPUT0", [1, DIMS], "FP32")])

    async def send() -> tuple[int, str]:
        try:
            await call(request, timeout=60)
        except grpc.RpcError as e:
            return GRPC_STATUS.get(e.code(), 500), f"{e.code().name} {e.details()}"
        return 200, ""
    return send


class ShmClient:
    """Inputs and outputs in the client's own registered regions; every answer is checked."""

    def __init__(self, host: str, port: int, index: int, tally: Tally) -> None:
        self.conn = loadgen.HttpConnection(host, port)
        self.tally = tally
        nbytes = DIMS * 4
        self.data = np.arange(DIMS, dtype=np.float32).reshape(1, DIMS) + index
        self.regions = []
        for kind in ("in", "out"):
            name, key = f"soak_{kind}_{index}", f"/soak_{os.getpid()}_{kind}_{index}"
            self.regions.append((name, key, shm.create_shared_memory_region(name, key, nbytes)))
        shm.set_shared_memory_region(self.regions[0][2], [self.data])
        body = json.dumps({
            "inputs": [{"name": "INPUT0", "shape": [1, DIMS], "datatype": "FP32",
                        "parameters": {"shared_memory_region": self.regions[0][0], "shared_memory_byte_size": nbytes}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": self.regions[1][0],
                                                          "shared_memory_byte_size": nbytes}}]}).encode()
        self.request = (f"POST /v2/models/soak/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        self.host, self.port, self.nbytes = host, port, nbytes

    async def register(self) -> None:
        for name, key, _ in self.regions:
            body = json.dumps({"key": key, "offset": 0, "byte_size": self.nbytes}).encode()
            status, reply = await self.conn.send(
                (f"POST /v2/systemsharedmemory/region/{name}/register HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            assert status == 200, reply

    async def send(self) -> tuple[int, str]:
        status, body = await self.conn.send(self.request)
        if status != 200:
            return status, json.loads(body or b"{}").get("error", "")
        out = shm.get_contents_as_numpy(self.regions[1][2], np.float32, [1, DIMS])
        if not np.array_equal(out, self.data):
            self.tally.wrong += 1
        return status, ""

    def close(self) -> None:
        for _, _, handle in self.regions:
            shm.destroy_shared_memory_region(handle)


def start_server(repo: Path, log: Path) -> tuple[subprocess.Popen, dict]:
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    argv = tritond_argv() + [
        "start", "--model-repository", str(repo), "--http-port", str(ports["http"]),
        "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
        "--model-control-mode=explicit", "--load-model=*", "--allow-client-shm=true",
        "--http-header-timeout-secs=2", "--http-body-timeout-secs=2"]
    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while not is_ready(f"127.0.0.1:{ports['http']}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"tritond did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, ports


async def soak(args, proc: subprocess.Popen, ports: dict, server_id: str, table: ProcessTable) -> tuple:
    host, port = "127.0.0.1", ports["http"]
    grpc_target = f"127.0.0.1:{ports['grpc']}"
    tally, chaos_log = Tally(), ChaosLog()
    stop = asyncio.Event()
    shm_clients = [ShmClient(host, port, i, tally) for i in range(args.shm_clients)]
    for c in shm_clients:
        await c.register()
    senders = ([http_sender(host, port, "soak", tally) for _ in range(args.http_clients)]
               + [grpc_sender(grpc_target, "solo") for _ in range(args.grpc_clients)]
               + [c.send for c in shm_clients]
               + [http_sender(host, port, "pipeline", tally) for _ in range(args.ensemble_clients)]
               + [http_sender(host, port, "reloaded", tally)]
               + [http_sender(host, port, "large", tally, LARGE) for _ in range(args.large_clients)])
    clients = [asyncio.create_task(keep_sending(send, tally, stop)) for send in senders]
    await asyncio.sleep(2.0)
    table.sample(proc.pid, table.start)
    chaos = Chaos((host, port), grpc_target, proc.pid, chaos_log, ("soak", "solo", "large"), "reloaded", RELOADED,
                  slow_limit_s=6.0, shm_key=shm_clients[0].regions[0][1])
    actions = [chaos.kill, chaos.malformed, chaos.reload, chaos.kill, chaos.slow, chaos.malformed]
    end = time.monotonic() + args.minutes * 60
    step = 0
    while time.monotonic() < end:
        await asyncio.sleep(args.chaos_interval)
        await actions[step % len(actions)]()
        step += 1
    stop.set()
    await asyncio.gather(*clients)
    await chaos.close()
    await asyncio.sleep(1.0)
    table.sample(proc.pid, table.end)
    broker = [pid for pid, role in session_processes(proc.pid).items() if role == "broker"]
    left_workers = orphans(proc.pid, broker[0]) if broker else []
    for c in shm_clients:
        c.close()
    return tally, chaos_log, left_workers, shm_usage(server_id)


def report(args, tally: Tally, log: ChaosLog, table: ProcessTable, workers_orphaned: list[int], shm_running: tuple,
           shm_after: tuple, left: dict, exit_code: int, inside: int) -> str:
    failed = sum(tally.failed.values())
    lines = [
        f"soak: {args.minutes:g} min; clients: HTTP {args.http_clients}, gRPC {args.grpc_clients}, "
        f"shm {args.shm_clients}, ensemble {args.ensemble_clients}, reloaded 1, large {args.large_clients}; "
        f"chaos every {args.chaos_interval:g} s",
        f"requests served {tally.served}, failed {failed}: " + ", ".join(
            f"{kind} {n}" for kind, n in sorted(tally.failed.items())) + f"; wrong shm answers {tally.wrong}",
        f"chaos: workers killed {len(log.kills)} (requests inside them per the broker: {inside}), "
        f"reloads {log.reloads} (refused {len(log.reloads_failed)}), slow connections {log.slow_opened} "
        f"(closed by the server {log.slow_closed}), malformed requests {log.malformed} "
        f"(answered other than 4xx: {len(log.malformed_unexpected)})",
    ]
    for kind, examples in sorted(tally.examples.items()):
        lines += [f"  e.g. {kind}: {e}" for e in examples]
    lines += [f"  reload refused: {e}" for e in log.reloads_failed[:3]]
    lines += [f"  malformed answered: {e}" for e in log.malformed_unexpected[:5]]
    lines += table.lines()
    lines += [
        f"/dev/shm at the end: {shm_running[0]} segments, {shm_running[1] / 2**20:.0f} MiB; "
        f"after the stop: {shm_after[0]} segments",
        f"orphan processes: {len(workers_orphaned)} workers not the broker's while running, "
        f"{len(left)} processes left after the stop; exit code {exit_code}",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--chaos-interval", type=float, default=2.0)
    p.add_argument("--http-clients", type=int, default=4)
    p.add_argument("--grpc-clients", type=int, default=4)
    p.add_argument("--shm-clients", type=int, default=2)
    p.add_argument("--ensemble-clients", type=int, default=2)
    p.add_argument("--large-clients", type=int, default=2, help=f"HTTP binary clients of {LARGE * 4 >> 10} KiB tensors")
    p.add_argument("--smoke", action="store_true", help="exit 1 unless every failure is expected and nothing leaks")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
        repo = Path(tmp) / "models"
        build(repo)
        log_path = Path(tmp) / "tritond.log"
        proc, ports = start_server(repo, log_path)
        server_id = re.search(r"server id ([0-9a-f]{32})", log_path.read_text()).group(1)
        table = ProcessTable()
        try:
            tally, log, orphaned, shm_running = asyncio.run(soak(args, proc, ports, server_id, table))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                exit_code = proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                exit_code = proc.wait()
        time.sleep(1.0)
        left = session_processes(proc.pid)
        shm_after = shm_usage(server_id)
        text = log_path.read_text(errors="replace")
    inside = sum(int(n) for n in re.findall(r"killed by signal 9 \(SIGKILL\)\); its batch held (\d+) request", text))
    print(report(args, tally, log, table, orphaned, shm_running, shm_after, left, exit_code, inside))
    if args.smoke:
        bad = (tally.failed["other"] + tally.failed["connection"] + tally.wrong + len(log.malformed_unexpected)
               + len(orphaned) + len(left) + shm_after[0] + exit_code)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
