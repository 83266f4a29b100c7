"""The broker's two ZeroMQ ROUTER sockets: one for frontends (and the supervisor), one for
workers. ipc:// endpoints in the server's private run directory, never TCP."""
from __future__ import annotations

import logging
import select
from collections.abc import Callable

import zmq

from tritond.wire.addresses import Addresses
from tritond.wire.schema import MAX_FRAME

log = logging.getLogger("tritond.broker")

BURST = 256     # frames handled per socket per loop turn, so neither side starves the other
# Two plain sends cost a quarter of send_multipart (which builds its flags with enum operations);
# replies to many streamed responses and sequence batches made this the broker's largest cost.
SNDMORE = int(zmq.SNDMORE)
# The same for reading: a frame read as two recv() calls with int flags costs a third of
# recv_multipart behind an EVENTS check with enum flags (perf/bench_broker.py).
NOBLOCK = int(zmq.NOBLOCK)
RCVMORE = int(zmq.RCVMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)


def _router(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
    s.setsockopt(zmq.ROUTER_MANDATORY, 0)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.bind(endpoint)
    return s


class BrokerSockets:
    def __init__(self, run_dir: str, shard: int = 0) -> None:
        addresses = Addresses(run_dir, shard)
        self.ctx = zmq.Context()
        self.fe = _router(self.ctx, addresses.frontends)
        self.wk = _router(self.ctx, addresses.workers)

    def to_frontend(self, ident: bytes, frame: bytes) -> None:
        self.fe.send(ident, SNDMORE)
        self.fe.send(frame)

    def to_worker(self, ident: bytes, frame: bytes) -> None:
        self.wk.send(ident, SNDMORE)
        self.wk.send(frame)

    def worker_pending(self) -> bool:
        """A worker message waits unread."""
        return bool(self.wk.getsockopt(EVENTS) & POLLIN)

    def wait_briefly(self, seconds: float) -> None:
        """Wait out a delay shorter than the poller's 1 ms resolution without spinning; a
        message arriving meanwhile ends the wait."""
        socks = (self.fe, self.wk)
        if any(s.getsockopt(EVENTS) & POLLIN for s in socks):
            return
        select.select([s.getsockopt(zmq.FD) for s in socks], [], [], seconds)

    @staticmethod
    def drain(sock: zmq.Socket, handle: Callable[[bytes, bytes], None]) -> None:
        """Handle what has arrived on a socket, at most a bounded burst per loop turn.

        A peer sends what one of its loop turns produced as one message of several frames
        (each a message of the wire); a ROUTER puts the sender's identity first. Every frame is
        untrusted: one that breaks its handler is logged and dropped, and the broker (with
        every model it serves) carries on."""
        for _ in range(BURST):
            try:
                ident = sock.recv(NOBLOCK)
            except zmq.Again:
                return
            while True:
                frame = sock.recv(NOBLOCK)
                try:
                    handle(ident, frame)
                except Exception:
                    log.exception("dropped a message that could not be handled")
                if not sock.getsockopt(RCVMORE):
                    break

    def close(self) -> None:
        self.fe.close()
        self.wk.close()
        self.ctx.term()
