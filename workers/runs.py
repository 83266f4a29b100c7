"""A serial Exec: several requests of a default-scheduled model in one message, each executed
on its own, in order, exactly as if each had arrived alone; one BatchDone answers them all.

The broker hands over a run only while requests queue behind a busy instance, so the model
sees what it would have seen one message at a time, and the messages each way are one per run
instead of one per request. A request cancelled while it waits its turn here is answered
CANCELLED without running, as it would have been in the broker's queue."""
from __future__ import annotations

from collections.abc import Callable

from tritond.wire import schema as P
from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError

from .responses import Flow


def execute_serially(execute: Callable[[P.Exec, int], P.BatchDone], flow: Flow, msg: P.Exec) -> P.BatchDone:
    """Run each request of `msg` through `execute` alone, each with its share of the inline
    budget (the one reply must stay as far below the sockets' frame limit as any batch's);
    the reply carries every result with its own times (`runs`) and their sums."""
    budget = P.INLINE_BUDGET // max(1, len(msg.requests))
    for r in msg.requests:              # a cancellation is heard from now on
        flow.open(r.key)
    results: list[P.ExecResult] = []
    runs: list[P.RunTimes] = []
    for r in msg.requests:
        if flow.is_cancelled(r.key):
            flow.close(r.key)
            results.append(P.ExecResult(error=TritonError(Code.CANCELLED, REQUEST_CANCELLED)))
            runs.append(P.RunTimes())
            continue
        done = execute(P.Exec(msg.bid, [r]), budget)
        results.extend(done.results)
        runs.append(P.RunTimes(done.input_ns, done.infer_ns, done.output_ns, done.start_ns))
    return P.BatchDone(msg.bid, results, sum(t.input_ns for t in runs), sum(t.infer_ns for t in runs),
                       sum(t.output_ns for t in runs), runs[0].start_ns if runs else 0, runs)
