"""Triton's default and dynamic batchers as a `Scheduling`: requests queue by priority level,
and a batch forms whenever an instance is free (batcher.py decides which requests it holds)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError, request_prefix, unavailable
from tritond.wire.schema import Infer

from tritond.broker.scheduling.batcher import BatchPolicy, Pending, Scheduler
from tritond.broker.scheduling.policy import Batches
from tritond.broker.test_hooks import delay_scheduler

if TYPE_CHECKING:
    from tritond.broker.supervision.pool import Instance
    from tritond.broker.tables.inflight import Req
    from tritond.broker.tables.model_version import ModelVersion

# A serial run: at most this many requests, and no more of the model's execution than this
# (a request committed to a run waits out the ones ahead of it in that instance, whatever
# arrives meanwhile); each result is answered within the worker's FLUSH_NS of its end.
RUN_MAX = 32
RUN_BUDGET_NS = 4_000_000
# The next run goes to an instance on its last request, or while no more than this much of its
# current run is left: about what the round trip through the broker takes, so the worker finds
# it waiting when it gets there.
EXTEND_NS = 1_000_000


class QueuedScheduling:
    def __init__(self, mv: "ModelVersion", path: Batches) -> None:
        self.queue = Scheduler(BatchPolicy.from_view(mv.view), delay_scheduler(mv.name))
        self.path = path
        self.preserve_ordering = self.queue.policy.preserve_ordering and not mv.view.decoupled
        # A decoupled request's sent responses cannot be redone.
        self.may_retry = mv.view.idempotent and not mv.view.decoupled
        self.iterative = False
        self._batched = mv.max_batch_size > 0
        policy = self.queue.policy
        # Only a dynamic batcher over variable-shape, shape-tensor or optional inputs keys
        # its requests by shape; every other model's requests batch freely.
        self._shape_key = policy.shape_key if policy.equal_shape or policy.optional_inputs else None
        # Batches of a dynamic batcher form at the end of the loop turn, from every request
        # that arrived in it, rather than the first one leaving alone.
        self._defer = self.queue.policy.dynamic and mv.max_batch_size > 1
        # A default scheduler hands a free instance the requests queued behind it as one serial
        # run (each still executes alone), when the model is quick enough that the run holds
        # none back long: decided here, for models whose requests are answered by their batch.
        self._runs = not policy.dynamic and not mv.view.decoupled and path.limiter is None
        self._request_ns = 0            # a request's execution time, as the model has shown it

    def __len__(self) -> int:
        return len(self.queue)

    def check(self, msg: Infer) -> None:
        pass

    def admit(self, req: "Req", msg: Infer, now_ns: int) -> None:
        inputs = msg.inputs
        bs = inputs[0].shape[0] if self._batched and inputs and inputs[0].shape else 1
        req.pending = Pending(req, now_ns, bs, self._shape_key(inputs) if self._shape_key else ())
        try:
            self.queue.enqueue(req.pending, msg.priority, msg.timeout_us, now_ns)
        except TritonError as e:
            raise TritonError(e.code, request_prefix(msg.id) + e.message) from None

    def dispatch(self, mv: "ModelVersion") -> None:
        """Form batches while an instance is free (a dynamic batcher's at the end of the loop
        turn); each goes to the least busy free instance."""
        if self._defer:
            self.path.at_turn_end(mv)
            return
        self._dispatch(mv)

    def _dispatch(self, mv: "ModelVersion") -> None:
        queue = self.queue
        path = self.path
        while len(queue):
            free = path.free_instances(mv)
            if not free:
                return
            now = path.clock.now_ns()
            self.expire(mv, now)
            batch, wake = queue.next_batch(now)
            if not batch:
                path.wake_at(mv, wake)
                return
            mv.wake_ns = 0
            serial = False
            if self._runs and len(queue) and self._request_ns:
                more = self._run_length(mv, len(queue)) - 1
                if more > 0:
                    batch += queue.take_run(more)
                    serial = len(batch) > 1
            path.send_batch(mv, queue.pick_instance(free), [p.key for p in batch], now, serial=serial)

    def extend(self, mv: "ModelVersion", inst: "Instance", left: int) -> None:
        if not self._runs or not self._request_ns or (left > 1 and left * self._request_ns > EXTEND_NS):
            return
        queue = self.queue
        now = self.path.clock.now_ns()
        self.expire(mv, now)
        batch, _ = queue.next_batch(now)
        if not batch:
            return
        more = self._run_length(mv, len(queue)) - 1
        if more > 0:
            batch += queue.take_run(more)
        self.path.extend_run(mv, inst, [p.key for p in batch], now)

    def _run_length(self, mv: "ModelVersion", queued: int) -> int:
        """The requests one instance takes at once: its share of what is queued, at most
        RUN_MAX, and no more than RUN_BUDGET_NS of the model's execution."""
        share = -(-(queued + 1) // max(1, len(mv.instances)))
        return min(RUN_MAX, share, RUN_BUDGET_NS // self._request_ns)

    def at_turn_end(self, mv: "ModelVersion") -> None:
        self._dispatch(mv)

    def expire(self, mv: "ModelVersion", now_ns: int) -> None:
        """Answer requests whose queue timeout passed under a REJECT policy."""
        deadline = self.queue.next_deadline()
        if deadline and deadline < now_ns:
            for p in self.queue.expire(now_ns):
                self.path.fail(p.key, unavailable("Request timeout expired"), "REJECTED")

    def next_deadline(self) -> int:
        return self.queue.next_deadline()

    def reap(self, mv: "ModelVersion", now_ns: int) -> int:
        return 0

    def finished(self, req: "Req", now_ns: int) -> None:
        pass

    def cancel(self, req: "Req") -> None:
        if self.queue.remove(lambda p: p is req.pending):
            self.path.fail(req, TritonError(Code.CANCELLED, REQUEST_CANCELLED), "CANCELED")

    def instance_lost(self, mv: "ModelVersion", inst: "Instance", how: str) -> None:
        pass

    def resized(self, added: list["Instance"], removed: list["Instance"]) -> None:
        pass

    def holds(self, inst: "Instance") -> bool:
        return False

    def forget(self, inst: "Instance") -> None:
        pass

    def remove(self, pred: Callable[[Pending], bool]) -> list[Pending]:
        return self.queue.remove(pred)

    def requeue_front(self, item: Pending) -> None:
        self.queue.requeue_front(item)

    def note_busy(self, instance: str, ns: int, requests: int = 1, executed_ns: int = 0) -> None:
        self.queue.note_busy(instance, ns)
        if self._runs and executed_ns:
            per = max(1, executed_ns // max(1, requests))
            self._request_ns = per if not self._request_ns else (3 * self._request_ns + per) // 4
