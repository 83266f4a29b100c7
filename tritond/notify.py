"""systemd's readiness protocol (sd_notify) without libsystemd: one datagram per state
change to the socket named by $NOTIFY_SOCKET, and the watchdog period from $WATCHDOG_USEC.

Outside systemd (no NOTIFY_SOCKET) every call is a no-op, so the supervisor calls it
unconditionally.
"""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("tritond")


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        if path.startswith("@"):              # abstract namespace socket
            path = "\0" + path[1:]
        self.address = path
        self.sock: socket.socket | None = None
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_s = self._watchdog_period(env)

    @staticmethod
    def _watchdog_period(env: dict[str, str]) -> float:
        """Seconds between WATCHDOG=1 pings (half of WatchdogSec), 0 when not asked for.
        WATCHDOG_PID, when set, must name this process (systemd's rule)."""
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
            return 0.0
        return int(usec) / 2e6

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, *fields: str) -> None:
        """Send `KEY=value` lines as one datagram; a failure is logged, never raised (the
        server keeps serving if systemd's socket goes away)."""
        if self.sock is None:
            return
        try:
            self.sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as e:
            log.warning("sd_notify to %s failed: %s", self.address.replace("\0", "@"), e.strerror)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
