"""What a worker knows about requests while they execute: which were cancelled, and how many
more responses a decoupled request may send before its requester catches up.

The model's threads (execute() on the main thread, or threads the model started) send a
decoupled request's responses; the worker's heartbeat thread receives the broker's
cancellations and credits. `Flow` is the table both sides share; a `Responder` is one request's
way out: it writes the outputs into this worker's shared memory and sends a `Respond` on the
worker's stream socket (shared by the model's threads under a lock).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tritond.wire.errors import TritonError
from tritond.wire.schema import OutputSpec


# Early cancellations kept: far more than a run can hold, so none is lost while a bounded
# table forgets those of requests that had already ended.
EARLY_MAX = 1024


class Flow:
    def __init__(self, stall_s: float = 60.0) -> None:
        # Every request opens and closes an entry: those take the lock itself (a C-level
        # context manager), not the Condition's Python-level one around it.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.live: dict[int, list[int]] = {}     # key -> [sent, allowed] (allowed < 0: no bound)
        self.cancelled: set[int] = set()
        # Cancellations heard before their request opened (its Exec still queued behind a run),
        # the latest EARLY_MAX of them.
        self.early: dict[int, None] = {}
        self.stall_s = stall_s                   # a requester silent this long is taken as gone

    def open(self, key: int, window: int = 0) -> None:
        with self.lock:
            self.live[key] = [0, window if window > 0 else -1]
            if self.early and key in self.early:
                del self.early[key]
                self.cancelled.add(key)

    def close(self, key: int) -> None:
        with self.lock:
            self.live.pop(key, None)
            self.cancelled.discard(key)

    def is_open(self, key: int) -> bool:
        with self.lock:
            return key in self.live

    def cancel(self, keys: list[int]) -> None:
        with self.cond:
            for key in keys:
                if key in self.live:
                    self.cancelled.add(key)
                else:
                    self.early[key] = None
                    if len(self.early) > EARLY_MAX:
                        del self.early[next(iter(self.early))]
            self.cond.notify_all()

    def grant(self, key: int, n: int) -> None:
        with self.cond:
            entry = self.live.get(key)
            if entry is not None and entry[1] >= 0:
                entry[1] += n
                self.cond.notify_all()

    def is_cancelled(self, key: int) -> bool:
        return key in self.cancelled

    def turn(self, key: int) -> bool:
        """Wait until request `key` may send one more response; False when it was cancelled
        (or its requester stalled), and the response should be dropped."""
        with self.cond:
            entry = self.live.get(key)
            if entry is None:
                return True
            if entry[1] >= 0 and entry[0] >= entry[1] and key not in self.cancelled:
                if not self.cond.wait_for(lambda: entry[0] < entry[1] or key in self.cancelled, self.stall_s):
                    self.cancelled.add(key)
            if key in self.cancelled:
                return False
            entry[0] += 1
            return True


Deliver = Callable[[int, list[OutputSpec], dict[str, Any] | None, TritonError | None, bool, dict | None], None]


class Responder:
    """One request's way to send responses while it executes (a decoupled model's, through
    pb_utils' response sender) and to learn that it was cancelled."""
    __slots__ = ("key", "specs", "flow", "deliver")

    def __init__(self, key: int, specs: list[OutputSpec], flow: Flow, deliver: Deliver) -> None:
        self.key = key
        self.specs = specs
        self.flow = flow
        self.deliver = deliver

    def is_cancelled(self) -> bool:
        return self.flow.is_cancelled(self.key)

    def send(self, outputs: dict[str, Any] | None, error: TritonError | None, final: bool,
             parameters: dict | None = None) -> None:
        """A response (outputs or error; neither: only the end), final or not. The sending
        thread then lets the worker's other threads run: a model streaming from many threads
        would otherwise hold the interpreter for its whole switch interval, and the worker's
        main thread (which starts new requests) would wait behind every stream."""
        if not final and not self.flow.turn(self.key):
            return
        self.deliver(self.key, self.specs, outputs, error, final, parameters)
        if final:
            self.flow.close(self.key)
        time.sleep(0)


class Discard:
    """The responses of a padding request of a sequence batch go nowhere."""
    __slots__ = ()

    def is_cancelled(self) -> bool:
        return False

    def send(self, outputs: dict[str, Any] | None, error: TritonError | None, final: bool,
             parameters: dict | None = None) -> None:
        pass


DISCARD = Discard()
