"""A dynamic batcher forms its batches at the end of the broker's loop turn, from every request
that arrived in it (and those already queued), rather than sending the first one alone; the
default scheduler still sends each request alone. Queue delay, preferred sizes and priorities
keep Triton's rules. All in the real broker, driven in-process."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.wire import schema as S

X = np.ones((1, 2), np.float32)
ONE = 'instance_group [{ count: 1 kind: KIND_CPU }]'


@pytest.fixture
def h(tmp_path) -> Harness:
    python_model(tmp_path, "dyn", ["X"], ["Y"], "dynamic_batching { } " + ONE, max_batch_size=8)
    python_model(tmp_path, "plain", ["X"], ["Y"], ONE, max_batch_size=8)
    python_model(tmp_path, "delayed", ["X"], ["Y"],
                 "dynamic_batching { max_queue_delay_microseconds: 500 } " + ONE, max_batch_size=8)
    python_model(tmp_path, "preferred", ["X"], ["Y"],
                 "dynamic_batching { preferred_batch_size: [2, 4] } " + ONE, max_batch_size=8)
    python_model(tmp_path, "levels", ["X"], ["Y"],
                 "dynamic_batching { priority_levels: 2 default_priority_level: 2 } " + ONE, max_batch_size=2)
    harness = Harness(tmp_path, model_load_thread_count=8).load("*")
    harness.from_frontend(S.Hello(S.PROTOCOL_VERSION, "grpc", 1))
    return harness


def infer_msg(h: Harness, model: str, priority: int = 0) -> S.Infer:
    return S.Infer(next(h.rids), model, -1, [S.TensorDesc("X", "FP32", [1, 2], S.Inline(X.tobytes()))],
                   priority=priority)


def sizes(h: Harness, model: str) -> list[int]:
    """The number of requests of each batch sent to `model`'s instances so far."""
    idents = {i.identity for i in h.instances(model)}
    return [len(m.requests) for ident, m in h.to_workers(S.Exec) if ident in idents]


def answer_all(h: Harness, model: str) -> None:
    for inst, ex in h.executing(model):
        h.answer(inst, ex, *({"Y": S.Inline(X.tobytes())} for _ in ex.requests))


def test_requests_of_one_turn_leave_as_one_batch(h):
    h.from_frontend_turn(*(infer_msg(h, "dyn") for _ in range(5)))
    assert sizes(h, "dyn") == [5]
    answer_all(h, "dyn")
    assert len(h.replies()) == 5


def test_without_dynamic_batching_each_request_of_a_turn_runs_alone(h):
    h.from_frontend_turn(*(infer_msg(h, "plain") for _ in range(3)))
    assert sizes(h, "plain") == [1]
    for _ in range(2):
        answer_all(h, "plain")
    assert sizes(h, "plain") == [1, 1, 1]


def test_a_freed_instance_takes_the_queue_and_the_turns_arrivals_together(h):
    h.infer("dyn", X=X)
    h.from_frontend_turn(infer_msg(h, "dyn"), infer_msg(h, "dyn"))    # queued: the instance is busy
    ((inst, ex),) = h.executing("dyn")
    # the batch ends and two more requests arrive in the same turn
    h.broker.on_worker_frame(inst.identity, S.encode(S.BatchDone(ex.bid, [S.ExecResult(
        [S.TensorDesc("Y", "FP32", [1, 2], S.Inline(X.tobytes()))])])))
    for _ in range(2):
        h.broker.on_frontend_frame(b"fe", S.encode(infer_msg(h, "dyn")))
    h.broker.end_turn()
    assert sizes(h, "dyn") == [1, 4]


def test_a_queue_delay_still_holds_the_turns_batch_and_the_loop_wakes_for_it(h):
    for _ in range(2):
        h.broker.on_frontend_frame(b"fe", S.encode(infer_msg(h, "delayed")))
    wake = h.broker.end_turn()
    assert sizes(h, "delayed") == []
    assert wake == h.clock.now_ns() + 500_000
    h.tick(0.0004)
    assert sizes(h, "delayed") == []
    h.tick(0.0002)
    assert sizes(h, "delayed") == [2]


def test_a_turn_larger_than_the_preferred_size_sends_the_preferred_prefix(h):
    h.from_frontend_turn(*(infer_msg(h, "preferred") for _ in range(5)))
    assert sizes(h, "preferred") == [4]
    answer_all(h, "preferred")
    assert sizes(h, "preferred") == [4, 1]


def test_priority_levels_order_the_turns_batch(h):
    low = [infer_msg(h, "levels", priority=2) for _ in range(2)]
    high = infer_msg(h, "levels", priority=1)
    h.from_frontend_turn(*low, high)
    ((_, ex),) = h.executing("levels")
    assert [r.key for r in ex.requests][0] == max(r.key for r in ex.requests)   # the last arrival, first
    assert len(ex.requests) == 2
