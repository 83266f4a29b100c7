"""The request path through the broker: admit a request to its model's scheduler, form
batches while an instance is free, send them, and answer each request when its batch is
done (or failed, expired, cancelled). Only bookkeeping: tensor bytes are never touched."""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from tritond.wire.errors import Code, TritonError, invalid, request_prefix, unavailable
from tritond.wire.schema import (
    BatchDone, Block, CancelKeys, Device, Exec, ExecRequest, ExecResult, Infer, InferReply, Region, TensorDesc,
    Zeros, heartbeat_identity,
)

from .client_regions import ClientRegions
from .clock import Clock
from .inflight import InflightTable, ReplyTo, Req
from .models import ModelVersion
from .pool import Instance, InstanceState
from .rate_limiter import RateLimiter
from .scheduler import Pending
from .streams import Streams

log = logging.getLogger("tritond.broker")

# How long requests wait for a model whose only instances are restarting; later ones are refused.
RESTART_WAIT_S = 30.0
CANCELLED = "request was cancelled"


class Sequences(Protocol):
    """The sequence batcher's path (broker/sequence_path.py), which takes over these steps."""
    def admit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> Req | None: ...
    def dispatch(self, mv: ModelVersion) -> None: ...
    def expire(self, mv: ModelVersion, now_ns: int) -> None: ...
    def finished(self, req: Req, now_ns: int) -> None: ...
    def cancel(self, req: Req) -> None: ...
    def instance_lost(self, mv: ModelVersion, inst: Instance, how: str) -> None: ...


def untrusted(msg: Infer, own_prefix: str) -> None:
    """Check what a frontend or a model says about memory (raises INVALID_ARG): it may name a
    client region or one of this server's segments only. Leases, resolved region keys, device
    handles and output targets are the broker's to set, so whatever the sender put there is
    discarded."""
    inputs = msg.inputs
    for i, d in enumerate(inputs):
        if any(x < 0 for x in d.shape):
            raise invalid(f"invalid shape for input '{d.name}': negative dimension")
        loc = d.loc
        if isinstance(loc, Block):
            if not loc.seg.startswith(own_prefix):
                raise invalid(f"input '{d.name}' has no data")
            if loc.lease:
                inputs[i] = TensorDesc(d.name, d.datatype, d.shape, Block(loc.seg, loc.offset, loc.nbytes))
        elif isinstance(loc, Region):
            if loc.key:
                inputs[i] = TensorDesc(d.name, d.datatype, d.shape, Region(loc.name, loc.offset, loc.nbytes))
        elif isinstance(loc, (Device, Zeros)):
            raise invalid(f"input '{d.name}' has no data")
    for o in msg.outputs:
        o.device_ok = False
        if o.region is not None and o.region.key:
            o.region = Region(o.region.name, o.region.offset, o.region.nbytes)


class RequestPath:
    """The default and dynamic schedulers' path; a sequence-batched model's requests take
    `sequences` (broker/sequence_path.py) for admission, batching and timers, and a decoupled
    model's are answered through `streams`."""

    def __init__(self, inflight: InflightTable, regions: ClientRegions,
                 send_exec: Callable[[Instance, Exec], None], clock: Clock,
                 send_worker: Callable[[bytes, Any], None] | None = None,
                 streams: Streams | None = None) -> None:
        self.inflight = inflight
        self.regions = regions
        self._send_exec = send_exec
        self._send_worker = send_worker
        self.clock = clock
        self.limiter: RateLimiter | None = None     # --rate-limit=execution_count
        self.streams = streams
        self.sequences: Sequences | None = None
        self.keys = itertools.count(1)

    # ---------------------------------------------------------------- admission

    def admit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> Req | None:
        """Queue a request on the model's scheduler (or answer it at once when it cannot
        wait); returns it while it is still queued or executing."""
        if mv.view.sequence is not None and self.sequences is not None:
            return self.sequences.admit(reply, msg, mv)
        try:
            regions = self.regions.resolve(msg)
        except TritonError as e:
            reply(InferReply(msg.rid, error=e))
            return None
        sched = mv.scheduler
        if sched is None:       # an ensemble's composing model mid-reload
            self.regions.release(regions)
            reply(InferReply(msg.rid, error=unavailable(f"model '{mv.name}' is not ready")))
            return None
        if self.restart_is_overdue(mv):
            self.regions.release(regions)
            reply(InferReply(msg.rid, error=self.restart_overdue(mv)))
            return None
        bs = msg.inputs[0].shape[0] if mv.max_batch_size > 0 and msg.inputs and msg.inputs[0].shape else 1
        now = self.clock.now_ns()
        req = Req(reply, msg, mv, now, Pending(None, now, bs, sched.policy.shape_key(msg.inputs)), regions=regions,
                  key=next(self.keys))
        req.pending.key = req
        try:
            sched.enqueue(req.pending, msg.priority, msg.timeout_us, now)
        except TritonError as e:
            self.regions.release(regions)
            reply(InferReply(msg.rid, error=TritonError(e.code, request_prefix(msg.id) + e.message)))
            return None
        self.dispatch(mv)
        return req

    # ---------------------------------------------------------------- batches

    def dispatch(self, mv: ModelVersion) -> None:
        """Form batches while an instance is free; each goes to the least busy free instance."""
        sched = mv.scheduler
        if sched is None:
            return
        if mv.view.sequence is not None and self.sequences is not None:
            self.sequences.dispatch(mv)
            return
        while len(sched):
            free = mv.free_instances()
            if self.limiter is not None and free:
                free = self.limiter.grantable(mv, free)
            if not free:
                return
            now = self.clock.now_ns()
            self.expire_queued(mv, now)
            batch, wake = sched.next_batch(now)
            if not batch:
                mv.wake_ns = wake
                return
            mv.wake_ns = 0
            self._send_batch(mv, sched.pick_instance(free), [p.key for p in batch], now)

    def _send_batch(self, mv: ModelVersion, inst: Instance, reqs: list[Req], now_ns: int,
                    requests: list[ExecRequest] | None = None) -> None:
        """Send a batch to `inst`; `requests` (sequence batches, with control inputs and padding)
        replace the plain ExecRequests of `reqs`."""
        decoupled = mv.view.decoupled
        ordered = mv.scheduler.policy.preserve_ordering and not decoupled
        worker = inst.identity
        for r in reqs:
            r.dispatch_ns = now_ns
            r.worker = worker
            if ordered and r.order < 0:
                r.order = mv.dispatch_seq
                mv.dispatch_seq += 1
            if decoupled and self.streams is not None:
                self.streams.add(r)
        bid = self.inflight.add(reqs)
        if self.limiter is not None:
            self.limiter.acquire(inst, bid)
        exec_msg = Exec(bid, requests if requests is not None else [
            ExecRequest(r.msg.inputs, r.msg.outputs, r.msg.id, r.msg.params,
                        r.msg.correlation_id, r.msg.flags, r.msg.timeout_us, r.key, window=r.msg.window)
            for r in reqs
        ])
        inst.batch = bid
        inst.batch_padding = sum(1 for r in requests if r.pad) if requests is not None else 0
        inst.state = InstanceState.BUSY
        inst.batch_started = self.clock.now()
        self._send_exec(inst, exec_msg)

    def on_batch_done(self, inst: Instance, mv: ModelVersion, msg: BatchDone) -> None:
        if inst.batch != msg.bid:
            return                  # not this instance's batch: a stale or confused worker
        reqs = self.inflight.pop(msg.bid)
        inst.batch = None
        if not reqs:
            if self.limiter is not None:
                self.limiter.release(msg.bid)
            return
        inst.served = True
        if inst.state is InstanceState.BUSY:    # a worker being killed or stopped gets no more work
            inst.state = InstanceState.READY
        inst.idle_since = self.clock.now()
        mv.scheduler.note_busy(inst.name, int((inst.idle_since - inst.batch_started) * 1e9))
        times = (msg.input_ns, msg.infer_ns, msg.output_ns)
        # Triton's onnxruntime backend reports no execution when every request of it failed;
        # its Python backend reports every execution.
        if mv.view.backend == "python" or any(res.error is None for res in msg.results):
            # as Triton's, a sequence batch's size counts its padding slots
            mv.stats.record_execution(sum(r.pending.batch_size for r in reqs) + inst.batch_padding, *times)
        if mv.view.decoupled:       # answered by the worker's Respond messages
            self.released(msg.bid, mv)
            return
        results = msg.results
        for i, req in enumerate(reqs):
            res = results[i] if i < len(results) else ExecResult(
                error=TritonError(Code.INTERNAL, f"model '{mv.name}' returned no result for the request"))
            if req.trace is not None:
                req.trace.compute(req.dispatch_ns, msg)
            self.finish(req, InferReply(req.msg.rid, mv.version, res.outputs, res.error, inst.identity),
                        res.error is None, times, "BACKEND")
        self.released(msg.bid, mv)

    def released(self, bid: int, mv: ModelVersion) -> None:
        """A batch ended: offer its instance (and the resources it held) to what waits."""
        if self.limiter is None or not self.limiter.release(bid):
            self.dispatch(mv)
            return
        for waiting in self.limiter.woken(mv):
            self.dispatch(waiting)

    def finish(self, req: Req, reply: InferReply, ok: bool, times: tuple[int, int, int] = (0, 0, 0),
               reason: str = "OTHER") -> None:
        """Answer a request: statistics (a failure counted for Triton's `reason`), release its
        client regions, keep the model's answer order under preserve_ordering."""
        now = self.clock.now_ns()
        mv = req.mv
        if req.seq is not None and self.sequences is not None:
            self.sequences.finished(req, now)
        if self.streams is not None and req.worker and mv.view.decoupled:
            self.streams.discard(req.key)
        if ok:
            mv.stats.record_success(req.pending.batch_size, now - req.arrival_ns,
                                    req.dispatch_ns - req.arrival_ns, *times, first_response=not mv.view.decoupled)
        else:
            mv.stats.record_failure(now - req.arrival_ns, reason)
        self.regions.release(req.regions)
        if req.order < 0:
            req.reply(reply)
            return
        mv.held[req.order] = [req.reply, reply]
        while mv.send_seq in mv.held:
            to, r = mv.held.pop(mv.send_seq)
            mv.send_seq += 1
            to(r)

    def fail(self, req: Req, err: TritonError, reason: str = "OTHER") -> None:
        self.finish(req, InferReply(req.msg.rid, error=err), False, reason=reason)

    # ---------------------------------------------------------------- failures

    def expire_queued(self, mv: ModelVersion, now_ns: int) -> None:
        """Answer requests whose queue timeout passed under a REJECT policy."""
        if mv.view.sequence is not None and self.sequences is not None:
            self.sequences.expire(mv, now_ns)
            return
        deadline = mv.scheduler.next_deadline()
        if deadline and deadline < now_ns:
            for p in mv.scheduler.expire(now_ns):
                self.fail(p.key, unavailable("Request timeout expired"), "REJECTED")

    @staticmethod
    def restart_overdue(mv: ModelVersion) -> TritonError:
        return unavailable(f"{mv.reason}; it did not serve again within {RESTART_WAIT_S:g} s")

    def restart_is_overdue(self, mv: ModelVersion) -> bool:
        return mv.restarting and self.clock.now() - mv.restarting_since > RESTART_WAIT_S

    def expire_restart_wait(self, mv: ModelVersion) -> None:
        """Fail what waits for a restart that is taking too long."""
        if self.restart_is_overdue(mv):
            self.fail_queued(mv, self.restart_overdue(mv))

    def fail_queued(self, mv: ModelVersion, err: TritonError) -> None:
        if mv.scheduler is None:
            return
        for p in mv.scheduler.remove(lambda _: True):
            self.fail(p.key, err)

    def lost_batch(self, mv: ModelVersion, bid: int | None, message: str, may_retry: bool) -> tuple[int, int]:
        """Answer the requests of a batch whose worker died; an idempotent model's requests go
        back to the head of the queue once. Returns (failed, retried)."""
        reqs = self.inflight.pop(bid)
        if self.limiter is not None and self.limiter.release(bid):
            for waiting in self.limiter.woken(mv):
                if waiting is not mv:
                    self.dispatch(waiting)
        retried = 0
        # A sequence's state and a decoupled request's sent responses cannot be redone.
        may_retry = may_retry and mv.view.sequence is None and not mv.view.decoupled
        for r in reqs:
            if may_retry and mv.view.idempotent and not r.retried and mv.scheduler is not None:
                r.retried = True
                r.dispatch_ns = 0
                mv.scheduler.requeue_front(r.pending)
                retried += 1
            else:
                self.fail(r, unavailable(message))
        return len(reqs) - retried, retried

    def lost_instance(self, mv: ModelVersion, inst: Instance, how: str) -> None:
        """After a worker died (its batch answered by lost_batch): its decoupled requests still
        streaming fail, and the sequences whose state it held are lost."""
        if self.streams is not None:
            for r in self.streams.lost(inst):
                self.fail(r, unavailable(f"inference failed because model '{mv.name}' instance '{inst.name}' {how}"))
        if mv.view.sequence is not None and self.sequences is not None:
            self.sequences.instance_lost(mv, inst, how)

    def cancel(self, req: Req) -> None:
        """The requester gave up: a queued request is taken out and answered CANCELLED; an
        executing one is flagged to its worker (the model sees `request.is_cancelled()`)."""
        sched = req.mv.scheduler
        if not req.dispatch_ns and sched is not None:
            if req.seq is not None and self.sequences is not None:
                self.sequences.cancel(req)
            elif sched.remove(lambda p: p is req.pending):
                self.fail(req, TritonError(Code.CANCELLED, CANCELLED))
            return
        if req.worker and self._send_worker is not None:
            self._send_worker(heartbeat_identity(req.worker), CancelKeys([req.key]))

    def cancel_all(self, versions: list[ModelVersion], err: TritonError) -> None:
        """Answer everything queued or executing with `err` (the exit timeout expired)."""
        for mv in versions:
            self.fail_queued(mv, err)
        for r in self.inflight.take_all():
            self.fail(r, err)
        if self.streams is not None:
            for r in list(self.streams.open.values()):
                self.fail(r, err)
