#!/usr/bin/env python3
"""The floor of tritond's internal request path: CPU per request of the message hops alone.

A request crosses frontend -> broker -> worker -> broker -> frontend. This benchmark runs that
chain with nothing else in it (no HTTP, no decoding, no model: each process only moves a small
frame on), in three processes, over two transports:

- `zmq`: what tritond uses (DEALER -> ROUTER | ROUTER <- DEALER over ipc://, a poller in the
  broker), so every message also wakes each side's ZeroMQ I/O thread;
- `unix`: plain AF_UNIX SOCK_SEQPACKET sockets read with epoll, no I/O threads.

It prints requests/s and CPU microseconds per request of each process (every thread, from
/proc), so the cost of the hops can be set against `perf/bench_cpu.py`'s whole-server figure
and against Triton's (run_anchors.sh): what remains is what the frontends, broker and workers
do themselves.

  python perf/bench_hops.py                       # both transports, concurrency 1 and 16
  python perf/bench_hops.py --transports zmq --concurrency 16 --seconds 5
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import tempfile
import time

import zmq

TICKS = os.sysconf("SC_CLK_TCK")
FRAME = b"x" * 256        # about a small inference request's control frame


def cpu_seconds(pid: int) -> float:
    """User + system time of every thread of `pid` so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


# ---------------------------------------------------------------- zmq, as tritond wires it

def zmq_broker(run_dir: str) -> None:
    ctx = zmq.Context()
    fe, wk = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    fe.bind(f"ipc://{run_dir}/fe")
    wk.bind(f"ipc://{run_dir}/wk")
    poller = zmq.Poller()
    poller.register(fe, zmq.POLLIN)
    poller.register(wk, zmq.POLLIN)
    worker = None
    client = None
    while True:
        for sock, _ in poller.poll():
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                ident, frame = sock.recv_multipart(zmq.NOBLOCK)
                if sock is wk:
                    if worker is None:
                        worker = ident
                        continue
                    fe.send(client, zmq.SNDMORE)
                    fe.send(frame)
                else:
                    client = ident
                    wk.send(worker, zmq.SNDMORE)
                    wk.send(frame)


def zmq_worker(run_dir: str) -> None:
    s = zmq.Context().socket(zmq.DEALER)
    s.connect(f"ipc://{run_dir}/wk")
    s.send(b"up")
    while True:
        s.send(s.recv())


def closed_loop(send, recv, concurrency: int, seconds: float) -> int:
    """Keep `concurrency` frames in flight for `seconds`; the number of round trips."""
    time.sleep(0.3)
    for _ in range(concurrency):
        send(FRAME)
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        recv()
        done += 1
        send(FRAME)
    return done


def zmq_client(run_dir: str, concurrency: int, seconds: float) -> int:
    s = zmq.Context().socket(zmq.DEALER)
    s.connect(f"ipc://{run_dir}/fe")
    return closed_loop(s.send, s.recv, concurrency, seconds)


# ---------------------------------------------------------------- plain unix sockets

def unix_broker(run_dir: str) -> None:
    listeners = {}
    for name in ("fe", "wk"):
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lsock.bind(f"{run_dir}/{name}.sock")
        lsock.listen(8)
        listeners[name] = lsock
    fe, _ = listeners["fe"].accept()
    wk, _ = listeners["wk"].accept()
    for s in (fe, wk):
        s.setblocking(False)
    ep = select.epoll()
    ep.register(fe.fileno(), select.EPOLLIN)
    ep.register(wk.fileno(), select.EPOLLIN)
    other = {fe.fileno(): (fe, wk), wk.fileno(): (wk, fe)}
    while True:
        for fd, _ in ep.poll():
            src, dst = other[fd]
            while True:
                try:
                    frame = src.recv(65536)
                except BlockingIOError:
                    break
                dst.send(frame)


def unix_connect(path: str) -> socket.socket:
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {path}")


def unix_worker(run_dir: str) -> None:
    time.sleep(0.2)         # the broker accepts the frontend side first
    s = unix_connect(f"{run_dir}/wk.sock")
    while True:
        s.send(s.recv(65536))


def unix_client(run_dir: str, concurrency: int, seconds: float) -> int:
    s = unix_connect(f"{run_dir}/fe.sock")
    return closed_loop(s.send, lambda: s.recv(65536), concurrency, seconds)


ROLES = {"zmq": (zmq_broker, zmq_worker, zmq_client), "unix": (unix_broker, unix_worker, unix_client)}


def spawn(fn, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn(*args)
        finally:
            os._exit(0)
    return pid


def run(transport: str, concurrency: int, seconds: float) -> dict[str, float]:
    broker_fn, worker_fn, client_fn = ROLES[transport]
    with tempfile.TemporaryDirectory(prefix="tritond-hops-") as run_dir:
        broker = spawn(broker_fn, run_dir)
        time.sleep(0.1)
        read_end, write_end = os.pipe()
        client = os.fork()
        if client == 0:
            os.close(read_end)
            done = client_fn(run_dir, concurrency, seconds + 1.0)
            os.write(write_end, str(done).encode())
            os._exit(0)
        worker = spawn(worker_fn, run_dir)
        os.close(write_end)
        pids = {"frontend side": client, "broker": broker, "worker": worker}
        time.sleep(0.8)                              # connections up, steady state
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        after = {k: cpu_seconds(p) for k, p in pids.items()}
        elapsed = time.monotonic() - t0
        total = int(os.read(read_end, 64) or b"0")
        os.close(read_end)
        os.waitpid(client, 0)
        for pid in (broker, worker):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    rate = total / (seconds + 1.0)
    n = rate * elapsed
    out = {k: 1e6 * (after[k] - before[k]) / n for k in pids}
    out["rate"] = rate
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transports", default="zmq,unix")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    print(f"{'transport':<10}{'c':>4}{'req/s':>10}{'frontend side':>15}{'broker':>9}{'worker':>9}{'total':>9}"
          "   (CPU us per request)")
    rows = {}
    for transport in args.transports.split(","):
        for c in map(int, args.concurrency.split(",")):
            r = run(transport, c, args.seconds)
            total = r["frontend side"] + r["broker"] + r["worker"]
            rows[(transport, c)] = total
            print(f"{transport:<10}{c:>4}{r['rate']:>10.0f}{r['frontend side']:>15.1f}{r['broker']:>9.1f}"
                  f"{r['worker']:>9.1f}{total:>9.1f}", flush=True)
    for c in map(int, args.concurrency.split(",")):
        if ("zmq", c) in rows and ("unix", c) in rows:
            print(f"c={c}: zmq/unix CPU per request {rows[('zmq', c)] / rows[('unix', c)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
