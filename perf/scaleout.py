#!/usr/bin/env python3
"""Scale-out simulation: the autoscaling rule of deploy/kubernetes (KEDA, Prometheus trigger,
metricType AverageValue) applied to real tritond servers under a stepped, open-loop load.

N tritond servers run on this machine on their own ports, behind a round-robin TCP load
balancer this script starts (as a Kubernetes Service spreads connections over pods). Each
request is a new connection (so that added replicas get traffic at once) to a Python model
that holds its only instance for --service-ms, so one replica serves about 1000/service-ms
requests/s whatever the CPU does. At each step the load generator sends requests at a fixed
rate; every 0.5 s the script reads nv_inference_pending_request_count from each active
server's /metrics, and at the end of the step applies the rule

    desired = clamp(ceil(sum over pods of avg(pending) / target), min, max)

then activates that many replicas for the next step, as KEDA's HPA would. The table shows
the queue rising when a step overloads the replicas and falling once replicas are added.

  python perf/scaleout.py                       # 3 servers, 40 ms model, target 8
  python perf/scaleout.py --replicas 4 --steps 10,30,60,60,90,90,30,30
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_core import READY_TIMEOUT_S, Server, free_port

MODEL = "slow_identity"
MODEL_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay = float(params["service_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(self.delay)
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.as_numpy())]))
        return out
'''
CONFIG = '''name: "slow_identity"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "service_ms" value: {{ string_value: "{service_ms}" }} }}
'''
BODY = b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}'
REQUEST = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n").encode() + BODY
PENDING = re.compile(r'^nv_inference_pending_request_count\{model="%s",version="1"\} (\S+)$' % MODEL, re.M)


def build_repository(dest: Path, service_ms: float) -> Path:
    (dest / MODEL / "1").mkdir(parents=True)
    (dest / MODEL / "config.pbtxt").write_text(CONFIG.format(service_ms=service_ms))
    (dest / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return dest


class Replica:
    def __init__(self, repository: Path, log: Path) -> None:
        self.metrics_port = free_port()
        self.server = Server(repository, log, ["--metrics-port", str(self.metrics_port), "--allow-grpc=false"])
        host, port = self.server.http.rsplit(":", 1)
        self.address = (host, int(port))

    def pending(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            m = PENDING.search(r.read().decode())
        return float(m.group(1)) if m else 0.0


class LoadBalancer:
    """Round-robin TCP proxy over the active replicas, one backend per connection."""

    def __init__(self) -> None:
        self.active: list[tuple[str, int]] = []
        self.turn = itertools.count()
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, backlog=4096)
        self.port = self.server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.active[next(self.turn) % len(self.active)]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def one_request(port: int, latencies: list[float], errors: list[int]) -> None:
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        await writer.drain()
        response = await reader.read()
        writer.close()
        if not response.startswith(b"HTTP/1.1 200"):
            errors.append(1)
            return
        latencies.append(time.perf_counter() - start)
    except OSError:
        errors.append(1)


async def run_step(lb: LoadBalancer, replicas: list[Replica], rate: float, seconds: float) -> dict:
    """Send `rate` requests/s for `seconds` (open loop) while sampling the queue gauge."""
    latencies: list[float] = []
    errors: list[int] = []
    samples: list[float] = []
    tasks: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    next_sample = start
    for i in itertools.count():
        due = start + i / rate
        if due - start >= seconds:
            break
        now = loop.time()
        if now >= next_sample:
            next_sample += 0.5
            values = await asyncio.gather(*(asyncio.to_thread(r.pending) for r in replicas))
            samples.append(sum(values))
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one_request(lb.port, latencies, errors)))
    return {"latencies": latencies, "errors": errors, "tasks": tasks,
            "pending": statistics.fmean(samples) if samples else 0.0, "last": samples[-1] if samples else 0.0}


def desired(pending_sum: float, target: float, low: int, high: int) -> int:
    """KEDA's Prometheus trigger with metricType AverageValue (HPA: ceil(total / target))."""
    return max(low, min(high, math.ceil(pending_sum / target))) if pending_sum > 0 else low


async def simulate(args: argparse.Namespace, replicas: list[Replica]) -> list[str]:
    lb = LoadBalancer()
    await lb.start()
    active = 1
    rows = []
    leftovers: list[asyncio.Task] = []
    capacity = 1000.0 / args.service_ms
    for step, rate in enumerate(args.steps, 1):
        lb.active = [r.address for r in replicas[:active]]
        r = await run_step(lb, replicas[:active], rate, args.step_seconds)
        leftovers += r["tasks"]
        lat = sorted(r["latencies"])
        p50 = f"{lat[len(lat) // 2] * 1000:8.0f}" if lat else "       -"
        want = desired(r["pending"], args.target, 1, len(replicas))
        rows.append(f"{step:>4} {rate:>8.0f} {active:>8} {rate / (active * capacity):>7.2f} "
                    f"{r['pending']:>12.1f} {r['last']:>12.0f} {p50} {len(r['errors']):>6} {want:>8}")
        active = want
    await asyncio.gather(*leftovers, return_exceptions=True)
    lb.server.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3, help="servers started (the rule's maxReplicaCount)")
    p.add_argument("--service-ms", type=float, default=40.0, help="time the model holds its instance per request")
    p.add_argument("--target", type=float, default=8.0, help="queued requests per replica the rule aims at")
    p.add_argument("--step-seconds", type=float, default=8.0)
    p.add_argument("--steps", type=lambda s: [float(x) for x in s.split(",")], default=[15, 40, 40, 40, 50, 15, 15],
                   help="request rate of each step, requests/s")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tritond-scaleout-") as tmp:
        repository = build_repository(Path(tmp) / "models", args.service_ms)
        replicas = [Replica(repository, Path(tmp) / f"server{i}.log") for i in range(args.replicas)]
        try:
            for r in replicas:
                r.server.wait_ready(READY_TIMEOUT_S)
            rows = asyncio.run(simulate(args, replicas))
        finally:
            for r in replicas:
                r.server.stop()
    print(f"KEDA rule: desired = clamp(ceil(sum(nv_inference_pending_request_count) / {args.target:g}), "
          f"1, {args.replicas}); one replica serves {1000 / args.service_ms:.0f} req/s "
          f"({args.service_ms:g} ms per request, 1 instance); {args.step_seconds:g} s per step")
    print(f"{'step':>4} {'rate/s':>8} {'replicas':>8} {'load':>7} {'avg pending':>12} {'end pending':>12} {'p50 ms':>8} "
          f"{'errors':>6} {'desired':>8}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
