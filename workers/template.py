"""A warm template: imports one backend's framework once, then forks workers on request.

`python -m tritond.workers.template <kind> <broker-pid> <fd>` is started by the broker with
one end of a socket pair (`fd`). It imports the framework and tritond's worker code, freezes
the collector's view of that heap (so collections in the workers do not write to the shared
pages), says it is ready, and then serves fork requests: each is a WorkerSpec as JSON, each
answer the new worker's pid. Framework code and import-time heap are shared copy-on-write by
every worker forked from here, instead of every worker paying its own import.

A worker is forked twice: the template forks an intermediate process that forks the worker and
exits at once, so the worker is re-parented to the broker (a child subreaper), which watches it
through a pidfd and reaps it like a spawned one. Those two forks of a large process take
milliseconds, more on a busy host, and the broker waits for the answer; so the template keeps
processes forked ahead (SPARES of them), each waiting on a socket for its spec: a fork request
hands the spec to a spare and is answered with its pid at once, and spares are forked again only
while no request waits, off the broker's path. A spare that was never used ends when the
template does (its socket closes). What a worker must not inherit is handled explicitly: the
template holds no ZeroMQ context, no socket but its pair with the broker (closed in the child),
no CUDA context (GPU workers are always spawned fresh) and no Python thread (checked before
every fork; a kind whose import starts one is never forked). Native helper threads that
libraries start at import (OpenBLAS's pool, onnxruntime's and OpenVINO's) do not cross a fork;
those libraries are fork-aware, as gunicorn's preloading and PyTorch's forked data loaders rely
on, and the template runs no computation that could leave them holding a lock. Random generators
are reseeded and logging set up anew.
"""
from __future__ import annotations

import gc
import importlib
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

import msgspec
from setproctitle import setproctitle

from tritond.process import die_with_parent, setup_logging
from tritond.repository.backends import backend_record
from tritond.wire.schema import BrokerToWorker, WorkerSpec, decoder

log = logging.getLogger("tritond.template")

READY = b"R"
REFUSED = 2         # exit code when importing the framework started threads
WAIT_FOR_REPARENT_S = 5.0
SPARES = 1          # processes forked ahead, each a fork request answered without forking


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
    decoder(BrokerToWorker)     # msgspec keeps what it learned of the types: the workers skip it
    gc.collect()
    gc.freeze()


class Spare:
    """A process forked ahead, already the broker's child, waiting on a socket for its spec."""

    def __init__(self, pid: int, sock: socket.socket | None) -> None:
        self.pid = pid
        self.sock = sock    # the spec goes in as one frame; closing it ends the spare

    def hand(self, request: bytes) -> int | None:
        """Give the spare its spec; its pid, or None when it is gone (killed meanwhile)."""
        try:
            send_frame(self.sock, request)
            return self.pid
        except OSError:
            return None
        finally:
            self.sock.close()


def fork_worker(spec: WorkerSpec | None, sock: socket.socket, broker_pid: int, kind: str = "",
                spares: tuple[Spare, ...] = ()) -> Spare:
    """Fork a process that ends up a child of the broker and runs `spec`'s worker, or (spec
    None) waits for its spec on a socket: a spare. It holds no other spare's socket, so each
    spare sees its socket close when the template ends."""
    if threading.active_count() != 1:
        raise RuntimeError(f"the template runs {threading.active_count()} Python threads; forking it is unsafe")
    r, w = os.pipe()
    ours, theirs = socket.socketpair() if spec is None else (None, None)
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            for other in spares:
                other.sock.close()
            worker = os.fork()
            if worker == 0:
                os.close(w)
                if ours is not None:
                    ours.close()
                _become_worker(spec, theirs, sock, broker_pid, kind)
            os.write(w, struct.pack("<q", worker))
        finally:
            os._exit(0)
    os.close(w)
    if theirs is not None:
        theirs.close()
    data = os.read(r, 8)
    os.close(r)
    os.waitpid(middle, 0)
    if len(data) != 8:
        if ours is not None:
            ours.close()
        raise RuntimeError("the forked worker's pid was not reported")
    return Spare(struct.unpack("<q", data)[0], ours)


def _become_worker(spec: WorkerSpec | None, specs: socket.socket | None, sock: socket.socket, broker_pid: int,
                   kind: str) -> None:
    """In the forked child: shed the template, then run the worker (a spare first waits for
    its spec; the template gone, it ends); never returns."""
    code = 1
    try:
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)      # run_worker sets the rest
        _reseed()
        deadline = time.monotonic() + WAIT_FOR_REPARENT_S
        while os.getppid() != broker_pid and time.monotonic() < deadline:
            time.sleep(0.001)
        if spec is None:
            setproctitle(f"tritond-spare template={kind}")
            with specs:
                request = recv_frame(specs)
            if not request:
                code = 0
                return
            spec = msgspec.json.decode(request, type=WorkerSpec)
        from tritond.workers.main import run_worker
        code = run_worker(spec)
    except BaseException:       # anything escaping is the worker's death, never the template's code path
        logging.getLogger("tritond.worker").exception("the forked worker failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reseed() -> None:
    """Forked workers must not share random streams with each other or the template: the
    generators the template holds are reseeded. One it never imported (numpy.random is loaded
    lazily) seeds itself from the system's entropy when a worker first imports it, so it is
    not imported here (that import would cost every worker more than the rest of its start)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
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
    spares: list[Spare] = []
    while True:
        if len(spares) < SPARES and not select.select([sock], [], [], 0)[0]:
            try:
                spares.append(fork_worker(None, sock, broker_pid, kind, tuple(spares)))
                continue
            except Exception as e:      # no spare: requests are forked as they come
                log.error("could not fork a spare %s worker: %s", kind, e)
        request = recv_frame(sock)
        if request is None:
            return 0            # the broker closed its end: it is gone or stopping (the spares end with us)
        pid = None
        while pid is None and spares:
            pid = spares.pop().hand(request)
        try:
            if pid is None:
                pid = fork_worker(decode(request), sock, broker_pid, kind, tuple(spares)).pid
        except Exception as e:
            log.error("could not fork a %s worker: %s", kind, e)
            pid = -1
        send_frame(sock, struct.pack("<q", pid))


def main(argv: list[str]) -> int:
    kind, broker_pid, fd = argv[1], int(argv[2]), int(argv[3])
    die_with_parent(broker_pid)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):     # the broker stops it by closing its socket
        signal.signal(sig, signal.SIG_IGN)
    setup_logging(0, f"template:{kind}")
    return serve(kind, broker_pid, fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
