"""An ensemble's `max_inflight_requests`: at most that many requests of each of its steps in
flight at once, counted across all of the ensemble's requests, so a decoupled step answering
faster than the steps below it can take its responses does not pile requests up in their queues.
A step over the limit waits here, first come first started, until one of that step's requests
ends (Triton pauses the step's scheduling the same way). An ensemble without the setting has no
gate: nothing is counted."""
from __future__ import annotations

from collections import deque
from typing import Protocol


class Waiter(Protocol):
    def gated_start(self, step: int) -> bool:
        """Start the step that waited; False when its request ended meanwhile."""


class StepGate:
    def __init__(self, limit: int, steps: int) -> None:
        self.limit = limit
        self.inflight = [0] * steps
        self.waiting: list[deque[Waiter]] = [deque() for _ in range(steps)]

    def admit(self, run: Waiter, step: int) -> bool:
        """True: the step may start now (it counts until `leave`); False: it waits its turn."""
        if self.inflight[step] < self.limit:
            self.inflight[step] += 1
            return True
        self.waiting[step].append(run)
        return False

    def leave(self, step: int) -> None:
        """One request of `step` ended: the first that waits for it, if any, starts."""
        self.inflight[step] -= 1
        queue = self.waiting[step]
        while queue and self.inflight[step] < self.limit:
            run = queue.popleft()
            self.inflight[step] += 1
            if not run.gated_start(step):
                self.inflight[step] -= 1

    def forget(self, run: Waiter, step: int) -> None:
        """A waiting step whose request was cancelled or failed gives up its turn."""
        try:
            self.waiting[step].remove(run)
        except ValueError:
            pass
