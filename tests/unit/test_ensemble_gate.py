"""The gate behind an ensemble's max_inflight_requests: per step, at most the limit admitted,
the rest started first come first served as admitted ones leave; a waiter that went away is
skipped and its turn passes on."""
from __future__ import annotations

from tritond.broker.ensembles.gate import StepGate


class Run:
    def __init__(self, name: str, log: list, alive: bool = True) -> None:
        self.name, self.log, self.alive = name, log, alive

    def gated_start(self, step: int) -> bool:
        if self.alive:
            self.log.append((self.name, step))
        return self.alive


def test_steps_are_counted_apart_and_waiters_start_in_order():
    log: list = []
    gate = StepGate(2, 2)
    a, b, c, d = (Run(n, log) for n in "abcd")
    assert gate.admit(a, 0) and gate.admit(b, 0)
    assert not gate.admit(c, 0) and not gate.admit(d, 0)
    assert gate.admit(c, 1)                 # another step has its own count
    gate.leave(0)
    assert log == [("c", 0)] and gate.inflight[0] == 2
    gate.leave(0)
    assert log == [("c", 0), ("d", 0)]
    gate.leave(0)
    gate.leave(0)
    assert gate.inflight == [0, 1] and not gate.waiting[0]


def test_a_waiter_that_went_away_passes_its_turn_on():
    log: list = []
    gate = StepGate(1, 1)
    assert gate.admit(Run("a", log), 0)
    gone, next_one = Run("gone", log, alive=False), Run("b", log)
    forgotten = Run("f", log)
    assert not gate.admit(gone, 0) and not gate.admit(forgotten, 0) and not gate.admit(next_one, 0)
    gate.forget(forgotten, 0)
    gate.leave(0)
    assert log == [("b", 0)] and gate.inflight == [1]
