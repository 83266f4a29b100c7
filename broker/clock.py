"""The broker's one source of time, so an in-process harness can drive it with a fake clock."""
from __future__ import annotations

import time


class Clock:
    """Monotonic time in seconds (float) and nanoseconds (int)."""

    def now(self) -> float:
        return time.monotonic()

    def now_ns(self) -> int:
        return time.monotonic_ns()
