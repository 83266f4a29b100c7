"""A model's own readiness check: Triton's python backend asks a model's `is_ready()` whenever a
client asks whether the model is ready, and tritond's workers do the same.

Only versions whose workers said at start-up that their model defines `is_ready()` are asked
(the frontends answer every other model from their table). Each of the version's serving
instances is asked; one check per instance is in flight at a time, and a client that asks
meanwhile waits for that check's answer, as Triton's backend has it. A client waits at most
READY_TIMEOUT_S (Triton's 5 s) and is then told not ready; the late answer still serves those
who asked after it. Every "not ready" is logged with its reason, as Triton's core logs it.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from tritond.wire import replies as R
from tritond.wire.schema import CheckReady, ReadyResult, encode

from tritond.broker.supervision.pool import Instance
from tritond.broker.tables.model_version import ModelVersion

log = logging.getLogger("tritond.broker")

READY_TIMEOUT_S = 5.0
TIMED_OUT = "Timed out waiting for user-defined is_ready() response"
GONE = "Stub process is not healthy while waiting for user-defined is_ready() response"
_CHECK = encode(CheckReady())


@dataclass(eq=False)
class _Ask:
    """One client's question about one version."""
    mv: ModelVersion
    answer: Callable[..., None]
    waiting: int            # instances whose answer it still needs
    deadline: float
    done: bool = False


class Readiness:
    def __init__(self, send_worker: Callable[[bytes, bytes], None], now: Callable[[], float]) -> None:
        self._send = send_worker
        self._now = now
        self.checking: dict[Instance, list[_Ask]] = {}
        self.asks: list[_Ask] = []          # not answered yet, oldest first

    def ask(self, mv: ModelVersion, instances: list[Instance], answer: Callable[..., None]) -> None:
        """Ask `instances` (the version's serving ones with a hook) whether they are ready."""
        if not instances:
            answer(R.ReadyReply(True))
            return
        ask = _Ask(mv, answer, len(instances), self._now() + READY_TIMEOUT_S)
        self.asks.append(ask)
        for inst in instances:
            waiting = self.checking.get(inst)
            if waiting is None:
                waiting = self.checking[inst] = []
                self._send(inst.identity, _CHECK)
            waiting.append(ask)

    def on_result(self, inst: Instance, msg: ReadyResult) -> None:
        for ask in self.checking.pop(inst, ()):
            if msg.ready:
                ask.waiting -= 1
                if ask.waiting == 0:
                    self._finish(ask, True)
            else:
                self._finish(ask, False, msg.error)

    def on_exit(self, inst: Instance) -> None:
        """The worker died with a check in flight: those waiting on it are told not ready."""
        for ask in self.checking.pop(inst, ()):
            self._finish(ask, False, GONE)

    def tick(self, now: float) -> float:
        """Answer the asks whose time is up (not ready); seconds until the next deadline."""
        while self.asks and (self.asks[0].done or self.asks[0].deadline <= now):
            ask = self.asks.pop(0)
            if not ask.done:
                self._finish(ask, False, TIMED_OUT)
        return self.asks[0].deadline - now if self.asks else math.inf

    def _finish(self, ask: _Ask, ready: bool, why: str = "") -> None:
        if ask.done:
            return
        ask.done = True
        if not ready:
            log.info("Model '%s' version %d is not ready: %s", ask.mv.name, ask.mv.version, why)
        ask.answer(R.ReadyReply(ready))
