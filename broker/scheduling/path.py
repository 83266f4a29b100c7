"""The request path through the broker: admit a request to its model's scheduling, send the
batches it forms, and answer each request when its batch is done (or failed, expired,
cancelled). Only bookkeeping: tensor bytes are never touched. What differs between the
default, dynamic and sequence batchers is behind one interface (policy.py)."""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from tritond.wire.errors import Code, TritonError, invalid, unavailable
from tritond.wire.schema import (
    BatchDone, Block, CancelKeys, Device, Exec, ExecRequest, ExecResult, Infer, InferReply, Region, TensorDesc,
    Zeros, heartbeat_identity,
)

from tritond.broker.clock import Alarm, Clock
from tritond.broker.scheduling.rate_limiter import RateLimiter
from tritond.broker.scheduling.retry import settle_lost
from tritond.broker.scheduling.streams import Streams
from tritond.broker.supervision.pool import Instance, InstanceState
from tritond.broker.tables.client_regions import ClientRegions
from tritond.broker.tables.inflight import InflightTable, ReplyTo, Req
from tritond.broker.tables.model_version import ModelVersion

log = logging.getLogger("tritond.broker")


def untrusted(msg: Infer, own_prefix: str) -> None:
    """Check what a frontend or a model says about memory (raises INVALID_ARG): it may name a
    client region or one of this server's segments only. Leases, resolved region keys, device
    handles and output targets are the broker's to set, so whatever the sender put there is
    discarded."""
    inputs = msg.inputs
    for i, d in enumerate(inputs):
        if d.shape and min(d.shape) < 0:
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
    """One path for every model: its `scheduler` (a `Scheduling`) queues and forms batches,
    this part sends them and answers; a decoupled model's requests are answered through
    `streams`."""

    def __init__(self, inflight: InflightTable, regions: ClientRegions,
                 send_worker: Callable[[bytes, Any], None], clock: Clock, streams: Streams,
                 restart_overdue: Callable[[ModelVersion], TritonError | None],
                 limiter: RateLimiter | None = None) -> None:
        self.inflight = inflight
        self.regions = regions
        self.send_worker = send_worker
        self.clock = clock
        self.limiter = limiter          # --rate-limit=execution_count
        self.streams = streams
        self._restart_overdue = restart_overdue
        self.keys = itertools.count(1)
        self.due: dict[int, ModelVersion] = {}      # models to form batches for at the end of the turn
        self.reap_ns = 0                             # when a policy next has idle state to reap (0: none)
        self.alarm = Alarm()                         # when a model's timer may next be due

    # ---------------------------------------------------------------- admission

    def admit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion, trace: Any = None) -> Req | None:
        """Queue a request on the model's scheduling (or answer it at once when it cannot
        wait); returns it while it is still queued or executing. `trace`: its trace
        (broker/observe/tracing.py), when it is traced: held before it may be dispatched."""
        sched = mv.scheduler
        try:
            if sched is not None:
                sched.check(msg)
            regions = self.regions.resolve(msg)
        except TritonError as e:
            reply(InferReply(msg.rid, error=e))
            return None
        err = (unavailable(f"model '{mv.name}' is not ready") if sched is None
               else self._restart_overdue(mv) if mv.restarting else None)
        if err is not None:     # an ensemble's composing model mid-reload, or a restart overdue
            self.regions.release(regions)
            reply(InferReply(msg.rid, error=err))
            return None
        now = self.clock.now_ns()
        if trace is not None and trace.setting.tensors:
            trace.queued(msg)
        req = Req(reply, msg, mv, now, None, regions=regions, trace=trace, key=next(self.keys))
        try:
            sched.admit(req, msg, now)
        except TritonError as e:
            self.regions.release(regions)
            reply(InferReply(msg.rid, error=e))
            return None
        deadline = sched.next_deadline()
        if deadline:                    # a queue or backlog timeout: the loop looks then
            self.alarm.set(deadline)
        sched.dispatch(mv)
        return req

    def wake_at(self, mv: ModelVersion, at_ns: int) -> None:
        """A policy's batch waits for its queue delay until `at_ns` (0: nothing waits)."""
        mv.wake_ns = at_ns
        if at_ns:
            self.alarm.set(at_ns)

    # ---------------------------------------------------------------- batches

    def dispatch(self, mv: ModelVersion) -> None:
        """Form the batches that are due (an instance freed, a model became ready)."""
        if mv.scheduler is not None:
            mv.scheduler.dispatch(mv)

    def free_instances(self, mv: ModelVersion) -> list[Instance]:
        free = mv.free_instances()
        if self.limiter is not None and free:
            return self.limiter.grantable(mv, free)
        return free

    def at_turn_end(self, mv: ModelVersion) -> None:
        self.due[id(mv)] = mv

    def end_turn(self) -> int:
        """Form the batches the policies left for the end of the loop turn; returns the
        earliest time one of those models wants another look (ns, 0: none)."""
        wake = 0
        if self.due:
            due, self.due = self.due, {}
            for mv in due.values():
                if mv.scheduler is not None:
                    mv.scheduler.at_turn_end(mv)
                    if mv.wake_ns and (not wake or mv.wake_ns < wake):
                        wake = mv.wake_ns
        return wake

    def reap_by(self, at_ns: int) -> None:
        if at_ns and (not self.reap_ns or at_ns < self.reap_ns):
            self.reap_ns = at_ns

    def reap(self, now_ns: int, versions: Iterable[ModelVersion]) -> int:
        """Let the policies forget idle state (sequences) when due; returns the next time to
        look (ns, 0: none)."""
        if not self.reap_ns or now_ns < self.reap_ns:
            return self.reap_ns
        wake = 0
        for mv in versions:
            if mv.scheduler is not None:
                at = mv.scheduler.reap(mv, now_ns)
                if at:
                    wake = min(wake, at) if wake else at
        self.reap_ns = wake
        return wake

    def send_batch(self, mv: ModelVersion, inst: Instance, reqs: list[Req], now_ns: int,
                   requests: list[ExecRequest] | None = None, serial: bool = False) -> None:
        """Send a batch to `inst`; `requests` (sequence batches, with control inputs and padding)
        replace the plain ExecRequests of `reqs`; a `serial` batch's requests execute one by one."""
        self._claim(mv, inst, reqs, now_ns)
        bid = self.inflight.add(reqs)
        if self.limiter is not None:
            self.limiter.acquire(inst, bid)
        exec_msg = Exec(bid, requests if requests is not None else _exec_requests(reqs), serial)
        inst.batch = bid
        inst.extensions = 0
        inst.batch_padding = sum(1 for r in requests if r.pad) if requests is not None else 0
        inst.move_to(InstanceState.BUSY)
        inst.batch_started = self.clock.now()
        self.send_worker(inst.identity, exec_msg)

    def extend_run(self, mv: ModelVersion, inst: Instance, reqs: list[Req], now_ns: int) -> None:
        """Send `reqs` as one more serial run behind the one `inst` executes, under its batch
        id: the worker starts them when that run ends, without waiting for the broker."""
        self._claim(mv, inst, reqs, now_ns)
        self.inflight.extend(inst.batch, reqs)
        inst.extensions += 1
        self.send_worker(inst.identity, Exec(inst.batch, _exec_requests(reqs), True))

    def _claim(self, mv: ModelVersion, inst: Instance, reqs: list[Req], now_ns: int) -> None:
        decoupled = mv.view.decoupled
        ordered = mv.scheduler.preserve_ordering
        worker = inst.identity
        for r in reqs:
            r.dispatch_ns = now_ns
            r.worker = worker
            if ordered and r.order < 0:
                r.order = mv.dispatch_seq
                mv.dispatch_seq += 1
            if decoupled:
                self.streams.add(r)

    def on_batch_done(self, inst: Instance, mv: ModelVersion, msg: BatchDone) -> None:
        if inst.batch != msg.bid:
            return                  # not this instance's batch: a stale or confused worker
        if msg.more or inst.extensions:
            if not msg.more:        # a run ended and the next, sent behind it, begins
                inst.extensions -= 1
            self._run_part(inst, mv, msg)
            return
        reqs = self.inflight.pop(msg.bid)
        inst.batch = None
        if not reqs:
            if self.limiter is not None:
                self.limiter.release(msg.bid)
            return
        executed = reqs
        if mv.scheduler.iterative:
            reqs, results = self._iterate(mv, reqs, msg)
        else:
            results = msg.results
        inst.served = True
        if inst.state is InstanceState.BUSY:    # a worker being killed or stopped gets no more work
            inst.move_to(InstanceState.READY)
        inst.idle_since = self.clock.now()
        mv.scheduler.note_busy(inst.name, int((inst.idle_since - inst.batch_started) * 1e9), len(executed),
                               msg.input_ns + msg.infer_ns + msg.output_ns)
        if msg.runs:
            self._serial_done(inst, mv, msg, reqs)
            return
        times = (msg.input_ns, msg.infer_ns, msg.output_ns)
        # Triton's onnxruntime backend reports no execution when every request of it failed;
        # its Python backend reports every execution.
        if mv.view.backend == "python" or any(res.error is None for res in msg.results):
            # as Triton's, a sequence batch's size counts its padding slots
            mv.stats.record_execution(sum(r.pending.batch_size for r in executed) + inst.batch_padding, *times)
        if mv.view.decoupled:       # answered by the worker's Respond messages
            self.released(msg.bid, mv)
            return
        owner = inst.identity
        for i, req in enumerate(reqs):
            res = results[i] if i < len(results) else ExecResult(
                error=TritonError(Code.INTERNAL, f"model '{mv.name}' returned no result for the request"))
            if req.trace is not None:
                req.trace.compute(req.dispatch_ns, msg)
            self.finish(req, InferReply(req.msg.rid, mv.version, res.outputs, res.error, owner,
                                        parameters=res.parameters), res.error is None, times, "BACKEND")
        self.released(msg.bid, mv)

    def _iterate(self, mv: ModelVersion, reqs: list[Req], msg: BatchDone) -> tuple[list[Req], list[ExecResult]]:
        """An iterative sequence model's batch: the requests it released to run again go back
        to their sequences; the others end theirs. Returns the requests to answer now, with
        their results (a decoupled model's are answered by its Respond messages)."""
        sched = mv.scheduler
        again = set(msg.rescheduled)
        now = self.clock.now_ns()
        answer, results = [], []
        for i, req in enumerate(reqs):
            if i in again:
                try:
                    sched.reschedule(req, now)
                except TritonError as e:
                    self.fail(req, e)
                continue
            sched.release(mv, req)
            answer.append(req)
            if i < len(msg.results):
                results.append(msg.results[i])
        if again:
            sched.dispatch(mv)
        return answer, results

    def _run_part(self, inst: Instance, mv: ModelVersion, msg: BatchDone) -> None:
        """A serial run's first results while the instance runs the rest: answered now, and
        the run's clock restarts (the execution timeout watches progress, not the whole run)."""
        reqs = self.inflight.answered(msg.bid, len(msg.runs))
        now = self.clock.now()
        mv.scheduler.note_busy(inst.name, int((now - inst.batch_started) * 1e9), len(reqs),
                               msg.input_ns + msg.infer_ns + msg.output_ns)
        inst.batch_started = now
        self._serial_answers(inst, mv, msg, reqs)
        if inst.state is InstanceState.BUSY and not inst.leaving and len(mv.scheduler):
            mv.scheduler.extend(mv, inst, self.inflight.count(msg.bid))

    def _serial_done(self, inst: Instance, mv: ModelVersion, msg: BatchDone, reqs: list[Req]) -> None:
        """The last results of a serial run; its instance is free."""
        self._serial_answers(inst, mv, msg, reqs)
        self.released(msg.bid, mv)

    def _serial_answers(self, inst: Instance, mv: ModelVersion, msg: BatchDone, reqs: list[Req]) -> None:
        """A serial run's requests, each counted and answered as the execution it was alone;
        one cancelled before its turn was not executed."""
        owner = inst.identity
        python = mv.view.backend == "python"
        for req, res, run in zip(reqs, msg.results, msg.runs):
            if run.start_ns > req.dispatch_ns:     # it waited in the run: queued until it began
                req.dispatch_ns = run.start_ns
            times = (run.input_ns, run.infer_ns, run.output_ns)
            ok = res.error is None
            if run.start_ns and (ok or python):
                mv.stats.record_execution(req.pending.batch_size, *times)
            if req.trace is not None and run.start_ns:
                req.trace.compute(req.dispatch_ns, BatchDone(msg.bid, [], *times, run.start_ns))
            reason = "BACKEND" if run.start_ns else "OTHER"     # as when cancelled in the queue
            self.finish(req, InferReply(req.msg.rid, mv.version, res.outputs, res.error, owner,
                                        parameters=res.parameters), ok, times, reason)
        for req in reqs[len(msg.runs):]:
            self.fail(req, TritonError(Code.INTERNAL, f"model '{mv.name}' returned no result for the request"))

    def released(self, bid: int, mv: ModelVersion) -> None:
        """A batch ended: offer its instance (and the resources it held) to what waits."""
        if self.limiter is None or not self.limiter.release(bid):
            if mv.scheduler is not None:
                mv.scheduler.dispatch(mv)
            return
        for waiting in self.limiter.woken(mv):
            self.dispatch(waiting)

    def finish(self, req: Req, reply: InferReply, ok: bool, times: tuple[int, int, int] = (0, 0, 0),
               reason: str = "OTHER") -> None:
        """Answer a request: statistics (a failure counted for Triton's `reason`), release its
        client regions, keep the model's answer order under preserve_ordering."""
        now = self.clock.now_ns()
        mv = req.mv
        sched = mv.scheduler
        if sched is not None:
            sched.finished(req, now)
        if req.worker and mv.view.decoupled:
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

    def fail_queued(self, mv: ModelVersion, err: TritonError) -> None:
        if mv.scheduler is None:
            return
        for p in mv.scheduler.remove(lambda _: True):
            self.fail(p.key, err)

    def lost_batch(self, mv: ModelVersion, bid: int | None, cause: str, may_retry: bool) -> tuple[int, int]:
        """Answer the requests of a batch whose worker died (`cause`), or requeue them once for
        an idempotent model (retry.py). Returns (failed, retried)."""
        reqs = self.inflight.pop(bid)
        if self.limiter is not None and self.limiter.release(bid):
            for waiting in self.limiter.woken(mv):
                if waiting is not mv:
                    self.dispatch(waiting)
        return settle_lost(self, mv, reqs, cause, may_retry)

    def lost_instance(self, mv: ModelVersion, inst: Instance, how: str) -> None:
        """After a worker died (its batch answered by lost_batch): its decoupled requests still
        streaming fail, and the sequences whose state it held are lost."""
        for r in self.streams.lost(inst):
            self.fail(r, unavailable(f"inference failed because model '{mv.name}' instance '{inst.name}' {how}"))
        if mv.scheduler is not None:
            mv.scheduler.instance_lost(mv, inst, how)

    def cancel(self, req: Req) -> None:
        """The requester gave up: a queued request is taken out and answered CANCELLED; an
        executing one is flagged to its worker (the model sees `request.is_cancelled()`)."""
        sched = req.mv.scheduler
        if not req.dispatch_ns and sched is not None:
            sched.cancel(req)
            return
        if req.worker:
            req.cancelled = True
            self.send_worker(heartbeat_identity(req.worker), CancelKeys([req.key]))

    def cancel_all(self, versions: list[ModelVersion], err: TritonError) -> None:
        """Answer everything queued or executing with `err` (the exit timeout expired)."""
        for mv in versions:
            self.fail_queued(mv, err)
        for r in self.inflight.take_all():
            self.fail(r, err)
        for r in list(self.streams.open.values()):
            self.fail(r, err)


def _exec_requests(reqs: list[Req]) -> list[ExecRequest]:
    return [ExecRequest(r.msg.inputs, r.msg.outputs, r.msg.id, r.msg.params, r.msg.correlation_id, r.msg.flags,
                        r.msg.timeout_us, r.key, window=r.msg.window, trace=r.trace.ref if r.trace is not None else None)
            for r in reqs]
