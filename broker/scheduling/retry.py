"""A lost batch run again: the requests of an idempotent model whose worker died go back to
the head of its queue, once.

Decided per request when the death is handled: one whose client has gone is answered as
cancelled, one whose timeout has passed or that is already on its second attempt fails with
the death's reason (both deaths' for a second attempt, so an input that kills every worker
fails instead of looping). A retried request keeps its client shared-memory regions and the
frontend keeps its input blocks, because neither is released before the request's final
answer; what the dead worker wrote went with its segments. Only retried requests pay for the
bookkeeping: their reply callable is wrapped to count a failure after the retry.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError, unavailable
from tritond.wire.schema import InferReply

from tritond.broker.observe.stats import ModelStats
from tritond.broker.scheduling.batcher import queue_timeout_us
from tritond.broker.scheduling.policy import Batches
from tritond.broker.tables.inflight import ReplyTo, Req

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion

log = logging.getLogger("tritond.broker")


class CountedReply:
    """The reply callable of a retried request: counts its failure, if it fails after all."""
    __slots__ = ("send", "stats")

    def __init__(self, send: ReplyTo, stats: ModelStats) -> None:
        self.send = send
        self.stats = stats

    def __call__(self, reply: InferReply) -> None:
        if reply.error is not None and not reply.more:
            self.stats.retry_failures += 1
        self.send(reply)


def timeout_us(mv: "ModelVersion", req: Req) -> int:
    """The request's timeout: the one its queue applies under dynamic batching (Triton's rule
    for overrides), else the one it asked for (0: none). Past it, a second run would answer
    later than the request was willing to wait."""
    queue = getattr(mv.scheduler, "queue", None)
    if queue is not None and queue.policy.dynamic:
        limit = queue_timeout_us(queue.queue_policy(req.pending.level), req.msg.timeout_us)
        if limit:
            return limit
    return req.msg.timeout_us


def settle_lost(path: Batches, mv: "ModelVersion", reqs: list[Req], cause: str,
                may_retry: bool) -> tuple[int, int]:
    """Answer or requeue the requests of a batch lost because `cause` ("instance 'x' died
    (...)"); returns (failed, retried)."""
    message = f"inference failed because model '{mv.name}' {cause}"
    sched = mv.scheduler
    if not (may_retry and sched is not None and sched.may_retry):
        for r in reqs:
            path.fail(r, unavailable(message))
        return len(reqs), 0
    now = path.clock.now_ns()
    again: list[Req] = []
    for r in reqs:
        if r.cancelled:
            path.fail(r, TritonError(Code.CANCELLED, REQUEST_CANCELLED), "CANCELED")
        elif r.retry_of:
            path.fail(r, unavailable(f"{message} while running it again after {r.retry_of}"))
        elif (limit := timeout_us(mv, r)) and now - r.arrival_ns >= limit * 1000:
            path.fail(r, unavailable(f"{message}; not run again: its timeout of {limit} us has passed"))
        else:
            again.append(r)
    for r in reversed(again):         # the batch's order, at the head of the queue
        r.retry_of = cause
        r.dispatch_ns = 0
        r.worker = b""
        r.reply = CountedReply(r.reply, mv.stats)
        sched.requeue_front(r.pending)
    if again:
        mv.stats.retries += len(again)
        log.warning("model '%s': running %d request(s) again after %s: request id(s) %s", mv.name, len(again),
                    cause, ", ".join(r.msg.id or "(none)" for r in again))
    return len(reqs) - len(again), len(again)
