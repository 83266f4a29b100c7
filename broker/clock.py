"""The broker's one source of time, so an in-process harness can drive it with a fake clock."""
from __future__ import annotations

import time


class Clock:
    """Monotonic time in seconds (float) and nanoseconds (int)."""

    def now(self) -> float:
        return time.monotonic()

    def now_ns(self) -> int:
        return time.monotonic_ns()


class Alarm:
    """The earliest moment (ns) one of the models' timers can be due: a queue timeout, a
    batch's queue delay, a sequence backlog's timeout. Whatever sets such a time lowers it, so
    the broker's loop walks the models' timers only when one may have come due, not every turn."""

    def __init__(self) -> None:
        self.at_ns = 0          # the first turn looks

    def set(self, at_ns: int) -> None:
        if at_ns < self.at_ns:
            self.at_ns = at_ns
