"""A worker's side of streaming and state: the credit window a decoupled request's sender waits
on, cancellation, and implicit state kept in the worker's arena from START to END."""
from __future__ import annotations

import threading

import numpy as np

from tritond.shm.arena import Arena
from tritond.workers.backends.base import WorkerRequest, WorkerResponse
from tritond.workers.responses import Flow, Responder
from tritond.workers.states import SequenceStates, StateSpec

SERVER = "f" * 32


class WatchedCondition(threading.Condition):
    """A condition that tells when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def test_a_sender_waits_for_credit_and_a_cancel_releases_it():
    flow = Flow(stall_s=5)
    flow.cond = WatchedCondition()
    sent = []
    r = Responder(7, [], flow, lambda key, specs, out, err, final, params: sent.append(out))
    flow.open(7, window=2)
    r.send({"a": 1}, None, False)
    r.send({"a": 2}, None, False)
    t = threading.Thread(target=r.send, args=({"a": 3}, None, False))
    t.start()
    assert flow.cond.waiting.wait(2)
    assert len(sent) == 2 and t.is_alive()           # the third waits for the requester
    flow.grant(7, 1)
    t.join(2)
    assert len(sent) == 3
    flow.cond.waiting.clear()
    t = threading.Thread(target=r.send, args=({"a": 4}, None, False))
    t.start()
    assert flow.cond.waiting.wait(2)                 # the fourth waits too ...
    flow.cancel([7])
    t.join(2)
    assert not t.is_alive() and len(sent) == 3        # dropped once cancelled
    assert r.is_cancelled()
    r.send(None, None, True)                          # the final flag still goes
    assert sent[-1] is None and 7 not in flow.live and not flow.is_cancelled(7)


def test_a_silent_requester_counts_as_gone():
    flow = Flow(stall_s=0.05)
    flow.open(1, window=1)
    assert flow.turn(1) and not flow.turn(1) and flow.is_cancelled(1)


def test_state_starts_from_the_initial_value_and_follows_the_model_until_end():
    arena = Arena(SERVER, "tst")
    try:
        spec = StateSpec("S_IN", "S_OUT", np.dtype(np.float32), [1, 1], np.float32([[5]]).tobytes())
        states = SequenceStates([spec], arena, ["Y"])

        def run(seq: int, flags: int, add: float) -> np.ndarray:
            req = WorkerRequest({"X": np.float32([[add]])}, [])
            states.feed(req, seq, flags, False, None)
            assert req.requested_outputs == ["Y", "S_OUT"]
            total = req.inputs["S_IN"] + req.inputs["X"]
            response = WorkerResponse({"Y": total, "S_OUT": total})
            states.keep(req, response, seq, flags, False)
            assert list(response.outputs) == ["Y"]        # clients never see the state
            return float(total[0, 0])

        assert [run(1, 1, 1.0), run(2, 1, 10.0), run(1, 0, 1.0), run(2, 0, 10.0)] == [6.0, 15.0, 7.0, 25.0]
        assert run(1, 2, 1.0) == 8.0 and 1 not in states.held       # END frees it
        assert run(1, 1, 0.0) == 5.0                                # a new START begins again
        pad = WorkerRequest({"X": np.float32([[0]])}, [])
        states.feed(pad, 0, 0, True, None)
        assert pad.inputs["S_IN"].tolist() == [[0.0]]
        states.end([1, 2])
        assert not states.held and arena.in_use() == 0
    finally:
        arena.close()


def test_a_state_output_the_config_declares_reaches_the_client_when_requested():
    """L0_implicit_state's test_request_output: with the state output also a config output, a
    request naming it (or naming no outputs) gets it; one naming other outputs does not."""
    arena = Arena(SERVER, "tst")
    try:
        spec = StateSpec("S_IN", "S_OUT", np.dtype(np.int32), [1])
        states = SequenceStates([spec], arena, ["Y", "S_OUT"])

        def run(requested: list[str], flags: int) -> list[str]:
            req = WorkerRequest({"X": np.int32([1])}, list(requested))
            states.feed(req, 1, flags, False, None)
            total = req.inputs["S_IN"] + req.inputs["X"]
            response = WorkerResponse({"Y": total, "S_OUT": total})
            states.keep(req, response, 1, flags, False, requested)
            return sorted(response.outputs)

        assert run(["Y", "S_OUT"], 1) == ["S_OUT", "Y"]
        assert run([], 0) == ["S_OUT", "Y"]
        assert run(["Y"], 0) == ["Y"]
        req = WorkerRequest({"X": np.int32([0])}, ["S_OUT"])
        states.feed(req, 1, 2, False, None)
        assert req.inputs["S_IN"].tolist() == [3]            # each step's state was kept
        states.keep(req, WorkerResponse({"Y": np.int32([3]), "S_OUT": np.int32([3])}), 1, 2, False, ["S_OUT"])
        assert not states.held and arena.in_use() == 0
    finally:
        arena.close()
