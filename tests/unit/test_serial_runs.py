"""A default scheduler hands a free instance the requests queued behind it as one serial Exec
(each still executes alone, in order) when the model is quick, and counts and answers each as
the execution it was. In the real broker, driven in-process, and the worker's side of it."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.broker.scheduling.queued import RUN_BUDGET_NS, RUN_MAX
from tritond.wire import schema as S
from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError
from tritond.workers.responses import Flow
from tritond.workers.runs import execute_serially

X = np.ones(2, np.float32)
QUICK_NS = 10_000


@pytest.fixture
def h(tmp_path) -> Harness:
    python_model(tmp_path, "plain", ["X"], ["Y"], 'instance_group [{ count: 1 kind: KIND_CPU }]')
    python_model(tmp_path, "pair", ["X"], ["Y"], 'instance_group [{ count: 2 kind: KIND_CPU }]')
    python_model(tmp_path, "dyn", ["X"], ["Y"], 'dynamic_batching { } instance_group [{ count: 1 kind: KIND_CPU }]',
                 max_batch_size=8)
    harness = Harness(tmp_path, model_load_thread_count=4).load("*")
    harness.from_frontend(S.Hello(S.PROTOCOL_VERSION, "http", 1))
    return harness


def send(h: Harness, model: str, n: int) -> list[int]:
    rids = [next(h.rids) for _ in range(n)]
    h.from_frontend_turn(*(S.Infer(rid, model, -1, [S.TensorDesc("X", "FP32", [2], S.Inline(X.tobytes()))])
                           for rid in rids))
    return rids


def result(i: int) -> S.ExecResult:
    return S.ExecResult([S.TensorDesc("Y", "FP32", [1], S.Inline(np.float32(i).tobytes()))])


def answer(h: Harness, model: str, ns: int = QUICK_NS) -> list[S.Exec]:
    """Every batch `model` executes is answered as a worker would, each request taking `ns`."""
    batches = h.executing(model)
    for inst, ex in batches:
        n = len(ex.requests)
        if ex.serial:
            runs = [S.RunTimes(0, ns, 0, 1 + i * ns) for i in range(n)]
            done = S.BatchDone(ex.bid, [result(r.key) for r in ex.requests], 0, n * ns, 0, 1, runs)
        else:
            done = S.BatchDone(ex.bid, [result(r.key) for r in ex.requests], 0, n * ns, 0, 1)
        h.from_worker(inst, done)
    return [ex for _, ex in batches]


def mv(h: Harness, model: str):
    return h.broker.registry.resolve(model, -1)


def test_a_quick_models_queue_goes_to_its_instance_as_one_serial_run(h):
    first = send(h, "plain", 1)
    queued = send(h, "plain", RUN_MAX + 3)
    [alone] = answer(h, "plain")
    assert not alone.serial and len(alone.requests) == 1
    [run] = answer(h, "plain")
    assert run.serial and len(run.requests) == RUN_MAX
    [rest] = answer(h, "plain")
    assert rest.serial and len(rest.requests) == 3
    replies = h.replies()
    assert sorted(replies) == sorted(first + queued)
    assert all(r.error is None for r in replies.values())
    stats = mv(h, "plain").stats
    assert stats.execution_count == stats.inference_count == RUN_MAX + 4


def test_the_first_request_runs_alone_until_the_model_has_shown_its_speed(h):
    send(h, "plain", 4)
    assert [len(ex.requests) for _, ex in h.executing("plain")] == [1]
    assert mv(h, "plain").scheduler._request_ns == 0


def test_a_slow_model_gets_no_run(h):
    send(h, "plain", 5)
    for _ in range(5):
        batches = answer(h, "plain", ns=RUN_BUDGET_NS)
        assert all(not ex.serial and len(ex.requests) == 1 for ex in batches)
    assert len(h.replies()) == 5


def test_a_run_holds_at_most_the_budget_of_the_models_execution(h):
    send(h, "plain", 1)
    send(h, "plain", 12)
    answer(h, "plain", ns=RUN_BUDGET_NS // 5)
    [run] = answer(h, "plain", ns=RUN_BUDGET_NS // 5)
    assert run.serial and len(run.requests) == 5


def test_each_instance_takes_its_share_of_the_queue(h):
    send(h, "pair", 2)
    answer(h, "pair")
    send(h, "pair", 2)            # both instances busy again: the rest queues
    send(h, "pair", 6)
    sizes = sorted(len(ex.requests) for ex in answer(h, "pair"))
    assert sizes == [1, 1]
    sizes = [len(ex.requests) for ex in answer(h, "pair")]
    assert sizes == [3, 2]          # half of six, then half of the three left (rounded up)
    assert [len(ex.requests) for ex in answer(h, "pair")] == [1]
    assert len(h.replies()) == 10


def test_a_dynamic_batcher_forms_batches_not_runs(h):
    send(h, "dyn", 1)
    send(h, "dyn", 4)
    answer(h, "dyn")
    [batch] = answer(h, "dyn")
    assert not batch.serial and len(batch.requests) == 4


def test_a_request_cancelled_while_it_waited_in_the_run_is_answered_cancelled_and_not_counted(h):
    send(h, "plain", 1)
    send(h, "plain", 2)
    answer(h, "plain")
    [(inst, run)] = h.executing("plain")
    assert run.serial
    done = S.BatchDone(run.bid, [result(0), S.ExecResult(error=TritonError(Code.CANCELLED, REQUEST_CANCELLED))],
                       0, QUICK_NS, 0, 1, [S.RunTimes(0, QUICK_NS, 0, 1), S.RunTimes()])
    h.from_worker(inst, done)
    errors = [r.error for r in h.replies().values() if r.error is not None]
    assert [e.code for e in errors] == [Code.CANCELLED]
    stats = mv(h, "plain").stats
    assert stats.execution_count == 2 and stats.inference_count == 2


def test_a_worker_that_dies_mid_run_fails_every_request_of_the_run(h):
    send(h, "plain", 1)
    send(h, "plain", 3)
    answer(h, "plain")
    [(inst, run)] = h.executing("plain")
    assert run.serial and len(run.requests) == 3
    h.die(inst)
    failed = [r for r in h.replies().values() if r.error is not None]
    assert len(failed) == 3 and all("plain" in r.error.message for r in failed)


# ---------------------------------------------------------------- the worker's side

def test_the_worker_executes_each_request_of_a_run_alone_and_skips_a_cancelled_one():
    flow = Flow()
    seen: list[list[int]] = []

    def execute(ex: S.Exec, budget: int) -> S.BatchDone:
        assert budget == S.INLINE_BUDGET // 3         # the run's reply stays within one batch's budget
        seen.append([r.key for r in ex.requests])
        if ex.requests[0].key == 1:
            flow.cancel([2])        # heard while request 1 executes
        return S.BatchDone(ex.bid, [result(ex.requests[0].key)], 1, 10, 2, 100 * ex.requests[0].key)

    msg = S.Exec(7, [S.ExecRequest([], key=k) for k in (1, 2, 3)], serial=True)
    done = execute_serially(execute, flow, msg)
    assert seen == [[1], [3]]
    assert done.bid == 7 and len(done.results) == 3
    assert done.results[1].error == TritonError(Code.CANCELLED, REQUEST_CANCELLED)
    assert [t.start_ns for t in done.runs] == [100, 0, 300]
    assert (done.input_ns, done.infer_ns, done.output_ns, done.start_ns) == (2, 20, 4, 100)
