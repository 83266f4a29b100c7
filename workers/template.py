"""A warm template: imports one backend's framework once, then forks workers on request.

`python -m tritond.workers.template <kind> <broker-pid> <fd>` is started by the broker with
one end of a socket pair (`fd`). It imports the framework and tritond's worker code, freezes
the collector's view of that heap (so collections in the workers do not write to the shared
pages), says it is ready, and then serves fork requests: each is a WorkerSpec as JSON, each
answer the new worker's pid. Framework code and import-time heap are shared copy-on-write by
every worker forked from here, instead of every worker paying its own import.

A worker is forked twice: the template forks an intermediate process that forks the worker
and exits at once, so the worker is re-parented to the broker (a child subreaper), which
watches it through a pidfd and reaps it like a spawned one. What a worker must not inherit is
handled explicitly: the template holds no ZeroMQ context, no socket but its pair with the
broker (closed in the child), no CUDA context (GPU workers are always spawned fresh) and no
Python thread (checked before every fork; a kind whose import starts one is never forked).
Native helper threads that libraries start at import (OpenBLAS's pool, onnxruntime's and
OpenVINO's) do not cross a fork; those libraries are fork-aware, as gunicorn's preloading
and PyTorch's forked data loaders rely on, and the template runs no computation that could
leave them holding a lock. Random generators are reseeded and logging set up anew.
"""
from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time

import msgspec

from tritond.process import die_with_parent, setup_logging
from tritond.repository.backends import backend_record
from tritond.wire.schema import WorkerSpec

log = logging.getLogger("tritond.template")

READY = b"R"
REFUSED = 2         # exit code when importing the framework started threads
WAIT_FOR_REPARENT_S = 5.0


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("<I", len(payload)) + payload)


def recv_frame(sock: socket.socket) -> bytes | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    return _recv_exact(sock, struct.unpack("<I", head)[0])


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def preload(kind: str) -> None:
    """Import the worker and what the registry says backend `kind` preloads (its framework and
    tritond's backend module), then keep that heap out of the collector's way."""
    for module in ["tritond.workers.main", *backend_record(kind).preload]:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


def fork_worker(spec: WorkerSpec, sock: socket.socket, broker_pid: int) -> int:
    """Fork `spec`'s worker so that it ends up a child of the broker; its pid."""
    if threading.active_count() != 1:
        raise RuntimeError(f"the template runs {threading.active_count()} Python threads; forking it is unsafe")
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            worker = os.fork()
            if worker == 0:
                os.close(w)
                _become_worker(spec, sock, broker_pid)
            os.write(w, struct.pack("<q", worker))
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 8)
    os.close(r)
    os.waitpid(middle, 0)
    if len(data) != 8:
        raise RuntimeError("the forked worker's pid was not reported")
    return struct.unpack("<q", data)[0]


def _become_worker(spec: WorkerSpec, sock: socket.socket, broker_pid: int) -> None:
    """In the forked child: shed the template, then run the worker; never returns."""
    code = 1
    try:
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)      # run_worker sets the rest
        _reseed()
        deadline = time.monotonic() + WAIT_FOR_REPARENT_S
        while os.getppid() != broker_pid and time.monotonic() < deadline:
            time.sleep(0.001)
        from tritond.workers.main import run_worker
        code = run_worker(spec)
    except BaseException:       # anything escaping is the worker's death, never the template's code path
        logging.getLogger("tritond.worker").exception("the forked worker failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reseed() -> None:
    """Forked workers must not share random streams with each other or the template."""
    import numpy as np
    np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def serve(kind: str, broker_pid: int, fd: int) -> int:
    sock = socket.socket(fileno=fd)
    preload(kind)
    if threading.active_count() != 1:
        log.error("importing the %s backend started Python threads; workers of this kind are spawned instead", kind)
        return REFUSED
    send_frame(sock, READY)
    decode = msgspec.json.Decoder(WorkerSpec).decode
    while True:
        request = recv_frame(sock)
        if request is None:
            return 0            # the broker closed its end: it is gone or stopping
        try:
            answer = struct.pack("<q", fork_worker(decode(request), sock, broker_pid))
        except Exception as e:
            log.error("could not fork a %s worker: %s", kind, e)
            answer = struct.pack("<q", -1)
        send_frame(sock, answer)


def main(argv: list[str]) -> int:
    kind, broker_pid, fd = argv[1], int(argv[2]), int(argv[3])
    die_with_parent(broker_pid)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):     # the broker stops it by closing its socket
        signal.signal(sig, signal.SIG_IGN)
    setup_logging(0, f"template:{kind}")
    return serve(kind, broker_pid, fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
