"""A serial Exec: several requests of a default-scheduled model in one message, each executed
on its own, in order, exactly as if each had arrived alone.

The broker hands over a run only while requests queue behind a busy instance (and the next run
before this one ends), so the model sees what it would have seen one message at a time, and the
instance never waits on a round trip to the broker. The results go back in as few messages as
keep each answer prompt: what has finished is sent (a BatchDone marked `more`) once FLUSH_NS
has passed since the last send, and the last BatchDone carries the rest, so a run of quick
requests costs one message each way and a slow request is answered as it ends. A request
cancelled while it waits its turn here is answered CANCELLED without running, as it would have
been in the broker's queue."""
from __future__ import annotations

import time
from collections.abc import Callable

from tritond.wire import schema as P
from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError

from .responses import Flow

# The longest a finished result waits for the rest of its run before it is sent on its own.
FLUSH_NS = 500_000


def execute_serially(execute: Callable[[P.Exec, int], P.BatchDone], flow: Flow, msg: P.Exec,
                     send: Callable[[P.BatchDone], None]) -> P.BatchDone:
    """Run each request of `msg` through `execute` alone, each with its share of the inline
    budget (no reply may carry more inline bytes than one batch's); each reply carries its
    results in order with their own times (`runs`) and their sums. Returns the last reply;
    the earlier ones (`more`) went through `send`."""
    budget = P.INLINE_BUDGET // max(1, len(msg.requests))
    for r in msg.requests:              # a cancellation is heard from now on
        flow.open(r.key)
    results: list[P.ExecResult] = []
    runs: list[P.RunTimes] = []
    sent_ns = time.monotonic_ns()
    for r in msg.requests:
        if results:                     # the last result always travels in the last reply
            now = time.monotonic_ns()
            if now - sent_ns >= FLUSH_NS:
                send(_reply(msg.bid, results, runs, True))
                results, runs, sent_ns = [], [], now
        if flow.is_cancelled(r.key):
            flow.close(r.key)
            results.append(P.ExecResult(error=TritonError(Code.CANCELLED, REQUEST_CANCELLED)))
            runs.append(P.RunTimes())
            continue
        done = execute(P.Exec(msg.bid, [r]), budget)
        results.extend(done.results)
        runs.append(P.RunTimes(done.input_ns, done.infer_ns, done.output_ns, done.start_ns))
    return _reply(msg.bid, results, runs, False)


def _reply(bid: int, results: list[P.ExecResult], runs: list[P.RunTimes], more: bool) -> P.BatchDone:
    return P.BatchDone(bid, results, sum(t.input_ns for t in runs), sum(t.infer_ns for t in runs),
                       sum(t.output_ns for t in runs), runs[0].start_ns if runs else 0, runs, more)
