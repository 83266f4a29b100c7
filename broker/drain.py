"""Graceful stop: refuse new requests, let in-flight ones finish within the exit timeout,
cancel what is left at the deadline, then stop (when SIGTERM asked for it)."""
from __future__ import annotations

from collections.abc import Callable

from tritond.wire.replies import DrainReply

STOP_GRACE_S = 10.0


class Drain:
    def __init__(self, exit_timeout_s: float) -> None:
        self.exit_timeout_s = exit_timeout_s
        self.stopping = False             # new requests are refused; the table says so
        self.deadline = 0.0
        self.cancelled = False            # in-flight requests were cancelled at the deadline
        self.stop_after = False           # SIGTERM to the broker: stop once drained
        self.stop_at = 0.0
        self._waiters: list[Callable[[DrainReply], None]] = []

    def begin(self, now: float, then_stop: bool = False) -> bool:
        """Start draining (once); True when this call started it."""
        self.stop_after = self.stop_after or then_stop
        if self.stopping:
            return False
        self.stopping = True
        self.deadline = now + self.exit_timeout_s
        return True

    def wait(self, answer: Callable[[DrainReply], None]) -> None:
        """`answer(DrainReply(drained))` once the drain ends."""
        self._waiters.append(answer)

    def tick(self, now: float, idle: bool, supervisor_alive: bool) -> tuple[bool, bool]:
        """Advance the drain: (cancel what is in flight now, stop the broker now)."""
        if not self.stopping:
            return False, False
        cancel = False
        if idle or now >= self.deadline:
            waiters, self._waiters = self._waiters, []
            for answer in waiters:
                answer(DrainReply(idle and not self.cancelled))
            if not idle:
                self.cancelled = cancel = True
            if self.stop_at == 0.0 and self.stop_after:
                self.stop_at = now + STOP_GRACE_S
        stop = bool(self.stop_at) and (now >= self.stop_at or not supervisor_alive)
        return cancel, stop
