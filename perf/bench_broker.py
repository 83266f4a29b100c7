#!/usr/bin/env python3
"""The broker's ceiling: its CPU per request, and the requests/s one broker reaches, when
several frontend processes flood it with small requests.

The HTTP and gRPC frontends cost more than the broker per request, so on a small host they
saturate first and hide the broker's limit. Here the frontends are replaced by flooders that
speak the broker's wire directly (Hello, then Infer frames kept `--window` deep, each reply
answered with a new request), so nearly all of the host is left to the broker and the workers.
The model is Triton's built-in `identity` backend (16 FP32, inline tensors), with
`--instances` instances and, with `--batch N`, dynamic batching up to N.

It prints requests/s and CPU microseconds per request of the broker (main thread and ZeroMQ
I/O threads apart), the workers and the flooders, and requests/s per broker core
(requests/s divided by the broker's busy fraction of one core).

With `--shards N` the server runs N brokers (--broker-shards) and one such model per broker,
each named so that it lands on a different one; flooder i floods broker i mod N. The broker
figures are then those of all brokers together per request, and each broker carries 1/N of
the requests: a server's broker ceiling is N times the per-core figure.

  python perf/bench_broker.py                                  # 4 flooders, 2 instances
  python perf/bench_broker.py --flooders 4 --window 64 --instances 4 --batch 32 --seconds 5
  python perf/bench_broker.py --window 64 --instances 2 --shards 2
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import Server, ServerStartError  # noqa: E402
from bench_cpu import sample  # noqa: E402

from tritond.repository.partition import shard_of  # noqa: E402
from tritond.wire import schema as S  # noqa: E402
from tritond.wire.addresses import Addresses  # noqa: E402

MODEL = "identity_flood"
INPUT = np.arange(16, dtype=np.float32).tobytes()


def model_names(shards: int) -> list[str]:
    """One model name per broker, the k-th scheduled by broker k."""
    if shards == 1:
        return [MODEL]
    names: dict[int, str] = {}
    n = 0
    while len(names) < shards:
        name = f"{MODEL}_{n}"
        names.setdefault(shard_of(name, shards), name)
        n += 1
    return [names[k] for k in range(shards)]


def write_model(repository: Path, name: str, instances: int, batch: int) -> None:
    """An identity model of 16 FP32; batching adds the batch dimension and dynamic batching."""
    (repository / name / "1").mkdir(parents=True)
    dims = "[ 16 ]" if batch else "[ -1 ]"
    batching = "dynamic_batching { }\n" if batch else ""
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {batch}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]\n'
        f'instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n{batching}')


def request(model: str, rid: int, batch: int) -> bytes:
    shape = [1, 16] if batch else [16]
    return S.encode(S.Infer(rid, model, inputs=[S.TensorDesc("INPUT0", "FP32", shape, S.Inline(INPUT))]))


def flood(endpoint: str, model: str, window: int, batch: int, start: float, stop: float, out: mp.Queue) -> None:
    """One flooder: say hello, wait for the table, keep `window` requests in flight until
    `stop`; count the replies that arrive between `start` and `stop` (wall clock)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    decode = S.decoder(S.BrokerToFrontend).decode
    sock.send(S.encode(S.Hello(S.PROTOCOL_VERSION, "http", os.getpid())))
    while not isinstance(decode(sock.recv()), S.Table):
        pass
    rid = 0
    for _ in range(window):
        rid += 1
        sock.send(request(model, rid, batch))
    counted = errors = 0
    while True:
        msg = decode(sock.recv())
        replies = msg.replies if isinstance(msg, S.Replies) else [msg] if isinstance(msg, S.InferReply) else []
        now = time.time()
        if now >= stop:
            break
        for reply in replies:
            errors += reply.error is not None
            if now >= start:
                counted += 1
            rid += 1
            sock.send(request(model, rid, batch))
    out.put((counted, errors))
    sock.close()
    ctx.term()


def broker_pid(server_pid: int) -> tuple[int, str]:
    """The broker's pid and its run directory, read from its command line."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == server_pid and b"tritond.broker.main" in argv:
            return int(pid), json.loads(argv[argv.index(b"tritond.broker.main") + 1])["run_dir"]
    raise RuntimeError("no broker process under the server")


def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        repository = Path(tmp) / "models"
        models = model_names(args.shards)
        for name in models:
            write_model(repository, name, args.instances, args.batch)
        server = Server(repository, Path(tmp) / "server.log", extra=["--broker-shards", str(args.shards)])
        try:
            server.wait_ready(120)
            pid, run_dir = broker_pid(server.proc.pid)
            out: mp.Queue = mp.Queue()
            t0 = time.time() + 1.0 + 0.2 * args.flooders
            start, stop = t0 + args.warmup, t0 + args.warmup + args.seconds
            procs = [mp.Process(target=flood, args=(Addresses(run_dir, i % args.shards).frontends,
                                                    models[i % args.shards], args.window, args.batch, start, stop,
                                                    out))
                     for i in range(args.flooders)]
            for p in procs:
                p.start()
            time.sleep(max(0.0, start - time.time()))
            before = sample(server.proc.pid)
            flooders_before = sum(_cpu(p.pid) for p in procs)
            time.sleep(max(0.0, stop - time.time()))
            after = sample(server.proc.pid)
            flooders = sum(_cpu(p.pid) for p in procs) - flooders_before
            results = [out.get(timeout=30) for _ in procs]
            for p in procs:
                p.join(10)
        except ServerStartError as e:
            return f"tritond did not start: {e}"
        finally:
            server.stop()
    count = sum(c for c, _ in results)
    errors = sum(e for _, e in results)
    cpu = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = max(count, 1)
    us = lambda *keys: sum(v for k, v in cpu.items() if k in keys) / n * 1e6  # noqa: E731
    broker_main, broker_io = us(("broker", "main")), us(("broker", "zmq I/O"))
    workers = sum(v for (r, _), v in cpu.items() if r == "worker") / n * 1e6
    rate = count / args.seconds
    busy = (broker_main + broker_io) * rate / 1e6
    per_core = rate / busy if busy else 0.0
    head = ("| brokers | flooders | window | instances | batch | requests/s | errors | broker main µs | "
            "broker ZeroMQ I/O µs | workers µs | flooders µs | requests/s per broker core |")
    return "\n".join([head, "|" + "---:|" * 12,
                      f"| {args.shards} | {args.flooders} | {args.window} | {args.instances} | {args.batch} | "
                      f"{rate:,.0f} | {errors} | "
                      f"{broker_main:.1f} | {broker_io:.1f} | {workers:.1f} | {flooders / n * 1e6:.1f} | {per_core:,.0f} |"])


def _cpu(pid: int) -> float:
    """User + system seconds of every thread of `pid` (0 once it is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    except OSError:
        return 0.0
    return total / ticks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flooders", type=int, default=4)
    p.add_argument("--window", type=int, default=32, help="requests each flooder keeps in flight")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--batch", type=int, default=0, help="max_batch_size with dynamic batching (0: none)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--shards", type=int, default=1, help="brokers (--broker-shards), one model on each")
    print(run(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
