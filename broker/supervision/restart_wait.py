"""How long requests wait for a model whose only instances are restarting.

While a model has no live instance but one restarts, its requests queue (a crash costs its
batch, not the requests behind it). The wait is bounded: a restart that takes longer fails what
waits, and later requests are refused at admission, with the model's reason."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tritond.wire.errors import TritonError, unavailable

from tritond.broker.clock import Clock

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion

RESTART_WAIT_S = 30.0


class RestartWait:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def overdue(self, mv: "ModelVersion") -> TritonError | None:
        """The error for a request that would wait past the bound (None: it may wait)."""
        if mv.restarting and self.clock.now() - mv.restarting_since > RESTART_WAIT_S:
            return unavailable(f"{mv.reason}; it did not serve again within {RESTART_WAIT_S:g} s")
        return None
