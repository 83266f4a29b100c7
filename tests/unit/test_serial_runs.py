"""A default scheduler hands a free instance the requests queued behind it as one serial Exec
(each still executes alone, in order), and counts and answers each as the execution it was:
the worker sends what finished as it goes, and the broker sends the next run before the current
one ends. In the real broker, driven in-process, and the worker's side of it."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.broker.scheduling.queued import EXTEND_NS, RUN_BUDGET_NS, RUN_MAX
from tritond.broker.supervision.pool import InstanceState
from tritond.wire import schema as S
from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError
from tritond.workers import runs as worker_runs
from tritond.workers.responses import EARLY_MAX, Flow
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
    parts: list[S.BatchDone] = []
    done = execute_serially(execute, flow, msg, parts.append)
    assert parts == []              # quick requests: one reply for the run
    assert seen == [[1], [3]] and not done.more
    assert done.bid == 7 and len(done.results) == 3
    assert done.results[1].error == TritonError(Code.CANCELLED, REQUEST_CANCELLED)
    assert [t.start_ns for t in done.runs] == [100, 0, 300]
    assert (done.input_ns, done.infer_ns, done.output_ns, done.start_ns) == (2, 20, 4, 100)


def test_the_worker_sends_what_finished_once_it_has_waited_long_enough(monkeypatch):
    monkeypatch.setattr(worker_runs, "FLUSH_NS", 0)      # every request slower than the flush bound

    def execute(ex: S.Exec, budget: int) -> S.BatchDone:
        return S.BatchDone(ex.bid, [result(ex.requests[0].key)], 0, 10, 0, ex.requests[0].key)

    parts: list[S.BatchDone] = []
    msg = S.Exec(3, [S.ExecRequest([], key=k) for k in (1, 2, 3)], serial=True)
    done = execute_serially(execute, Flow(), msg, parts.append)
    assert [(p.more, [t.start_ns for t in p.runs]) for p in parts] == [(True, [1]), (True, [2])]
    assert not done.more and [t.start_ns for t in done.runs] == [3]     # the last result ends the run


def test_a_cancellation_heard_before_its_request_opens_is_kept_and_bounded():
    flow = Flow()
    flow.cancel([5])
    flow.open(5)
    assert flow.is_cancelled(5)
    flow.close(5)
    flow.cancel(list(range(100, 100 + 3 * EARLY_MAX)))    # requests that had already ended
    assert len(flow.early) == EARLY_MAX
    flow.open(6)
    assert not flow.is_cancelled(6)


# ---------------------------------------------------------------- answered as it goes, and extended

def part(ex: S.Exec, keys: range, more: bool, ns: int = QUICK_NS) -> S.BatchDone:
    """The worker's reply for requests `keys` (indices into `ex`) of a serial run."""
    reqs = [ex.requests[i] for i in keys]
    return S.BatchDone(ex.bid, [result(r.key) for r in reqs], 0, len(reqs) * ns, 0, 1,
                       [S.RunTimes(0, ns, 0, 1) for _ in reqs], more)


def test_a_runs_results_are_answered_as_they_come_and_its_instance_stays_busy(h):
    send(h, "plain", 1)
    rids = send(h, "plain", 3)
    answer(h, "plain", ns=EXTEND_NS)        # too slow for the next run to go early
    [(inst, run)] = h.executing("plain")
    assert run.serial and len(run.requests) == 3
    h.from_worker(inst, part(run, range(1), True, ns=EXTEND_NS))
    assert rids[0] in h.replies() and rids[1] not in h.replies()
    assert inst.state is InstanceState.BUSY and inst.batch == run.bid
    h.from_worker(inst, part(run, range(1, 3), False, ns=EXTEND_NS))
    assert all(r in h.replies() and h.replies()[r].error is None for r in rids)
    assert inst.state is InstanceState.READY
    stats = mv(h, "plain").stats
    assert stats.execution_count == stats.inference_count == 4


def test_a_worker_that_dies_after_answering_part_of_a_run_fails_only_the_rest(h):
    send(h, "plain", 1)
    rids = send(h, "plain", 3)
    answer(h, "plain", ns=EXTEND_NS)
    [(inst, run)] = h.executing("plain")
    h.from_worker(inst, part(run, range(1), True, ns=EXTEND_NS))
    h.die(inst)
    replies = h.replies()
    assert replies[rids[0]].error is None
    assert all(replies[r].error is not None for r in rids[1:])


def test_the_next_run_is_sent_before_the_current_one_ends(h):
    send(h, "plain", 1)
    rids = send(h, "plain", RUN_MAX + 8)
    answer(h, "plain")
    [(inst, run)] = h.executing("plain")
    assert len(run.requests) == RUN_MAX
    h.from_worker(inst, part(run, range(RUN_MAX - 1), True))      # one to go: the rest follows now
    [ext] = [m for i, m in h.to_workers(S.Exec) if i == inst.identity and m.bid == run.bid and m is not run]
    assert ext.serial and len(ext.requests) == 8
    h.from_worker(inst, part(run, range(RUN_MAX - 1, RUN_MAX), False))
    assert inst.state is InstanceState.BUSY                        # the worker went on to the next run
    assert len(h.replies()) == 1 + RUN_MAX
    h.from_worker(inst, part(ext, range(8), False))
    assert inst.state is InstanceState.READY and inst.batch is None
    assert sorted(h.replies())[-len(rids):] == sorted(rids)
    stats = mv(h, "plain").stats
    assert stats.execution_count == stats.inference_count == RUN_MAX + 9


def test_a_worker_that_dies_with_a_run_sent_behind_its_own_fails_both(h):
    send(h, "plain", 1)
    send(h, "plain", RUN_MAX + 2)
    answer(h, "plain")
    [(inst, run)] = h.executing("plain")
    h.from_worker(inst, part(run, range(RUN_MAX - 1), True))
    h.die(inst)
    failed = [r for r in h.replies().values() if r.error is not None]
    assert len(failed) == 3         # the run's last request and the two sent behind it
