"""The supervisor's one source of time, so a unit test can drive it with a fake clock."""
from __future__ import annotations

import time


class Clock:
    """Monotonic seconds, and waiting some out."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
