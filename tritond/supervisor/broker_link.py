"""The supervisor's ZeroMQ link to the broker: a DEALER socket to the broker's frontend
ROUTER, opened afresh for each broker process. The ZeroMQ context is made on the first
connect, not at construction. `wait` is the supervisor's one blocking call: it wakes for the
broker's messages and for any other descriptor the loop waits on."""
from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable

import zmq

from tritond.wire import schema as S

Waitable = int | socket.socket | zmq.Socket


class BrokerLink:
    def __init__(self) -> None:
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._decoder = S.decoder(S.BrokerToFrontend)
        self._cids = 0

    def connect(self, endpoint: str) -> None:
        """Drop the socket to a previous broker and greet the new one."""
        if self._ctx is None:
            self._ctx = zmq.Context()
        if self._sock is not None:
            self._sock.close(0)
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._sock.send(S.encode(S.Hello(S.PROTOCOL_VERSION, "supervisor", os.getpid())))

    def request(self, op: S.ControlOp) -> int:
        """Send a control op; returns the id its ControlReply will carry."""
        self._cids += 1
        self._sock.send(S.encode(S.Control(self._cids, op)))
        return self._cids

    def tell(self, op: S.ControlOp) -> None:
        """Send a control op whose answer nobody awaits; dropped when the broker cannot take
        it now (a stuck broker must not stall the supervisor)."""
        self._cids += 1
        try:
            self._sock.send(S.encode(S.Control(self._cids, op)), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def pending(self) -> bool:
        return bool(self._sock is not None and self._sock.poll(0))

    def receive(self) -> S.BrokerToFrontend:
        return self._decoder.decode(self._sock.recv())

    def wait(self, others: Iterable[Waitable], timeout_s: float) -> set[Waitable]:
        """Wait until the broker has sent something or one of `others` is readable, at most
        `timeout_s`; returns those of `others` that are (the objects given: ZeroMQ's poller
        answers a Python socket by its descriptor)."""
        poller = zmq.Poller()
        if self._sock is not None:
            poller.register(self._sock, zmq.POLLIN)
        given = {o.fileno() if isinstance(o, socket.socket) else o: o for o in others}
        for key in given:
            poller.register(key, zmq.POLLIN)
        return {given[key] for key, _ in poller.poll(math.ceil(timeout_s * 1000)) if key in given}

    def close(self) -> None:
        """Idempotent."""
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        if self._ctx is not None and not self._ctx.closed:
            self._ctx.term()
