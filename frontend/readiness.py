"""A frontend's side of its readiness link with the supervisor (a SEQPACKET socket pair).

The frontend says LISTENING once its port is open; the supervisor answers SERVING once
every frontend process of the server has said so, and the frontend acknowledges with
SERVING once it answers ready. Until then it serves requests that reach it but answers
not-ready, so "ready" means the same thing on every process and to systemd: all startup
models loaded and every HTTP and gRPC worker serving.
"""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable

log = logging.getLogger("tritond.frontend")

LISTENING = b"listening"
SERVING = b"serving"


class SupervisorLink:
    def __init__(self, fd: int | None, on_serving: Callable[[], None]) -> None:
        """`fd` is the inherited end of the pair; `on_serving` runs when the supervisor
        says serve (at once when there is no supervisor to ask)."""
        self.sock = socket.socket(fileno=fd) if fd is not None else None
        self.on_serving = on_serving
        if self.sock is None:
            on_serving()

    def listening(self) -> None:
        """Report the port open, then wait (on the event loop) to be told to serve."""
        if self.sock is None:
            return
        self.sock.setblocking(False)
        try:
            self.sock.send(LISTENING)
        except OSError as e:
            log.warning("could not tell the supervisor this frontend is listening: %s", e.strerror)
            return
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        try:
            said = self.sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            said = b""
        if said == SERVING:
            self.on_serving()
            try:
                self.sock.send(SERVING)
            except OSError:
                pass
        else:                                  # closed: the supervisor is gone
            asyncio.get_running_loop().remove_reader(self.sock.fileno())

    def close(self) -> None:
        if self.sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
            except RuntimeError:
                pass
            self.sock.close()
            self.sock = None
