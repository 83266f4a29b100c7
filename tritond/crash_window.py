"""The crash-loop rule shared by the supervisor (broker and frontend restarts) and the broker
(worker restarts): at most `limit` crashes in any `window_s` seconds. Past it, restarting
again only repeats the crash, so the caller gives up instead (the supervisor exits, the broker
marks the instance FAILED). The time is an argument, so each caller uses its own clock."""
from __future__ import annotations


class CrashWindow:
    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self.times: list[float] = []      # the crashes still inside the window, oldest first

    def record(self, now: float) -> bool:
        """Note a crash at `now`; False when it is one more than the window allows."""
        self.times = [t for t in self.times if now - t < self.window_s] + [now]
        return len(self.times) <= self.limit

    def clear(self) -> None:
        """Forget every crash: what ran since proved healthy."""
        self.times = []

    def __len__(self) -> int:
        return len(self.times)
