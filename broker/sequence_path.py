"""The request path of sequence-batched models: admission with Triton's checks and errors,
batches with the control inputs (START, END, READY, CORRID) and padding the model reads,
backlog timeouts, idle sequences, cancellation, and sequences lost with their worker.

Bookkeeping is in broker/sequences.py; this part turns it into messages. The implicit state
of a sequence lives in the worker that runs it (workers/states.py): an ExecRequest names the
sequence (`seq`) and the worker feeds and keeps the state; the broker tells a worker to free
the state of a sequence that ended without an END request reaching it (idle, cancelled).
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

from tritond.wire.errors import Code, TritonError, invalid, request_prefix
from tritond.wire.schema import (
    EndSequences, ExecRequest, Infer, InferReply, Inline, ModelView, SequenceControl, TensorDesc, Zeros,
)

from .clock import Clock
from .inflight import ReplyTo, Req
from .models import ModelVersion
from .pool import Instance
from .registry import ModelRegistry
from .requests import CANCELLED, RequestPath
from .scheduler import Pending
from .sequences import BACKLOG_EXPIRED, FLAG_END, FLAG_START, SequenceBatcher, lost_message

log = logging.getLogger("tritond.broker")

_PACK = {"INT32": "<i"}
_CORRID_PACK = {"UINT64": ("<Q", (1 << 64) - 1), "INT64": ("<Q", (1 << 64) - 1),
                "UINT32": ("<I", (1 << 32) - 1), "INT32": ("<I", (1 << 32) - 1)}


def _scalar(datatype: str, value: float) -> bytes:
    if datatype == "BOOL":
        return struct.pack("<?", bool(value))
    if datatype == "FP32":
        return struct.pack("<f", float(value))
    return struct.pack(_PACK[datatype], int(value))


class Controls:
    """The control input tensors of one model, prebuilt for every flag combination."""

    def __init__(self, view: ModelView) -> None:
        seq = view.sequence
        self.shape = [1, 1] if view.max_batch_size > 0 else [1]
        self.flags: dict[tuple[bool, bool, bool], list[TensorDesc]] = {}
        kinds = [(k, seq.controls[k]) for k in ("START", "END", "READY") if k in seq.controls]
        for start in (False, True):
            for end in (False, True):
                for ready in (False, True):
                    on = {"START": start, "END": end, "READY": ready}
                    self.flags[(start, end, ready)] = [self._tensor(c, c.true if on[k] else c.false)
                                                       for k, c in kinds]
        self.corrid: SequenceControl | None = seq.controls.get("CORRID")

    def _tensor(self, c: SequenceControl, value: float) -> TensorDesc:
        return TensorDesc(c.name, c.datatype, self.shape, Inline(_scalar(c.datatype, value)))

    def inputs(self, flags: int, corrid: int | str, ready: bool) -> list[TensorDesc]:
        out = list(self.flags[(ready and bool(flags & FLAG_START), ready and bool(flags & FLAG_END), ready)])
        c = self.corrid
        if c is not None:
            if c.datatype == "BYTES":
                raw = str(corrid).encode() if ready else b""
                data = struct.pack("<I", len(raw)) + raw
            else:
                fmt, mask = _CORRID_PACK[c.datatype]       # ids are uint64; narrower types truncate
                data = struct.pack(fmt, int(corrid) & mask if ready else 0)
            out.append(TensorDesc(c.name, c.datatype, self.shape, Inline(data)))
        return out


def check_corrid(msg: Infer, mv: ModelVersion) -> None:
    """Triton's checks before the sequence batcher (batch size, a correlation id of the type the
    model's CORRID control takes), with its texts; raises INVALID_ARG."""
    if mv.max_batch_size > 0 and msg.inputs and msg.inputs[0].shape and msg.inputs[0].shape[0] > 1:
        raise invalid(f"inference request to model '{mv.name}' must specify batch-size 1 due to requirements of "
                      f"sequence batcher")
    corrid = msg.correlation_id
    if corrid == 0 or corrid == "":
        raise invalid(f"inference request to model '{mv.name}' must specify a non-zero or non-empty correlation ID")
    control = mv.view.sequence.controls.get("CORRID")
    if control is not None:
        given = "BYTES" if isinstance(corrid, str) else "UINT64"
        if (given == "BYTES") != (control.datatype == "BYTES"):
            raise invalid(f"{request_prefix(msg.id)}sequence batching control '{control.name}' data-type is "
                          f"'{given}', but model '{mv.name}' expects '{control.datatype}'")


class SequencePath:
    def __init__(self, requests: RequestPath, registry: ModelRegistry, send_worker: Callable[[bytes, Any], None],
                 clock: Clock) -> None:
        self.requests = requests
        self.registry = registry
        self._send_worker = send_worker
        self.clock = clock
        self.controls: dict[int, Controls] = {}      # id(view) -> controls
        self.reap_ns = 0                             # when a sequence may first be idle (0: none active)
        self.due: dict[int, ModelVersion] = {}       # models to form batches for at the end of the turn
        requests.sequences = self

    def _controls(self, mv: ModelVersion) -> Controls:
        c = self.controls.get(id(mv.view))
        if c is None:
            if len(self.controls) > 256:
                self.controls.clear()
            c = self.controls[id(mv.view)] = Controls(mv.view)
        return c

    # ---------------------------------------------------------------- admission

    def admit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> Req | None:
        batcher = mv.scheduler
        try:
            check_corrid(msg, mv)
            regions = self.requests.regions.resolve(msg)
        except TritonError as e:
            reply(InferReply(msg.rid, error=e))
            return None
        if not isinstance(batcher, SequenceBatcher):       # mid-reload
            self.requests.regions.release(regions)
            reply(InferReply(msg.rid, error=TritonError(Code.UNAVAILABLE, f"model '{mv.name}' is not ready")))
            return None
        now = self.clock.now_ns()
        req = Req(reply, msg, mv, now, Pending(None, now, 1, _shape_key(mv.view, msg)), regions=regions,
                  key=next(self.requests.keys))
        req.pending.key = req
        try:
            req.seq = batcher.enqueue(req.pending, msg.correlation_id, msg.flags, msg.timeout_us, now)
        except TritonError as e:
            self.requests.regions.release(regions)
            reply(InferReply(msg.rid, error=e))
            return None
        self._reap_by(batcher.reap_at)
        if msg.flags & FLAG_START and len(req.seq.queue) > 1:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", msg.correlation_id, mv.name)
        self.dispatch(mv)
        return req

    def end_turn(self) -> None:
        """Form the batches the loop turn made possible: the requests of many sequences that
        arrive together (their clients got the previous batch's answers at once) share one
        execution, instead of the first one running alone."""
        due, self.due = self.due, {}
        for mv in due.values():
            self.dispatch_now(mv)

    # ---------------------------------------------------------------- batches

    def dispatch(self, mv: ModelVersion) -> None:
        """Look for batches of `mv` at the end of this loop turn."""
        self.due[id(mv)] = mv

    def dispatch_now(self, mv: ModelVersion) -> None:
        """Send a batch to every free instance that has one; remember when to look again."""
        batcher = mv.scheduler
        if not isinstance(batcher, SequenceBatcher):
            return
        now = self.clock.now_ns()
        for inst in mv.instances:
            if inst.serving and inst.name in batcher.down:
                batcher.instance_up(inst.name, now)
        self.expire(mv, now)
        wake = 0
        for inst in mv.free_instances():
            entries, at = batcher.next_batch(inst.name, now)
            if entries:
                self._send(mv, inst, entries, now)
            elif at:
                wake = min(wake, at) if wake else at
        mv.wake_ns = wake

    def _send(self, mv: ModelVersion, inst: Instance, entries: list[Pending | None], now_ns: int) -> None:
        controls = self._controls(mv)
        reqs: list[Req] = []
        execs: list[ExecRequest] = []
        model = next(p.key for p in entries if p is not None)
        for p in entries:
            if p is None:
                pad = [TensorDesc(d.name, d.datatype, d.shape, Zeros()) for d in model.msg.inputs]
                execs.append(ExecRequest(pad + controls.inputs(0, 0, False), pad=True))
                continue
            r: Req = p.key
            m = r.msg
            execs.append(ExecRequest(m.inputs + controls.inputs(m.flags, m.correlation_id, True), m.outputs, m.id,
                                     m.params, m.correlation_id, m.flags, m.timeout_us, r.key, r.seq.key,
                                     window=m.window))
            reqs.append(r)
        self.requests._send_batch(mv, inst, reqs, now_ns, execs)

    def finished(self, req: Req, now_ns: int) -> None:
        """A request of the model was answered (done, failed, cancelled)."""
        batcher = req.mv.scheduler
        if isinstance(batcher, SequenceBatcher):
            batcher.done(req.pending, now_ns)

    # ---------------------------------------------------------------- timers

    def expire(self, mv: ModelVersion, now_ns: int) -> None:
        batcher = mv.scheduler
        if isinstance(batcher, SequenceBatcher) and batcher.backlog:
            for p in batcher.expire(now_ns):
                self.requests.fail(p.key, TritonError(Code.UNAVAILABLE, BACKLOG_EXPIRED))

    def _reap_by(self, at: int) -> None:
        if at and (not self.reap_ns or at < self.reap_ns):
            self.reap_ns = at

    def timers(self, now_ns: int) -> int:
        """Forget idle sequences (their workers free the state); returns the next time to look
        (ns, 0: none)."""
        if not self.reap_ns or now_ns < self.reap_ns:
            return self.reap_ns
        wake = 0
        for mv in self.registry.versions():
            batcher = mv.scheduler
            if not isinstance(batcher, SequenceBatcher) or not batcher.active:
                continue
            reaped, at = batcher.reap(now_ns)
            if reaped:
                self._end_state(mv, reaped)
                self.dispatch(mv)      # backlogged sequences may have taken the slots
            if at:
                wake = min(wake, at) if wake else at
        self.reap_ns = wake
        return wake

    def _end_state(self, mv: ModelVersion, seqs: list) -> None:
        """Tell each live worker to free the state of these sequences (a worker that never ran
        one ignores its key)."""
        keys = [s.key for s in seqs]
        for inst in mv.instances:
            if inst.serving:
                self._send_worker(inst.identity, EndSequences(keys))

    # ---------------------------------------------------------------- cancellation and failures

    def cancel(self, req: Req) -> None:
        """Cancelling a queued request of a sequence cancels the sequence, as in Triton: its
        queued requests are answered CANCELLED and its slot is freed."""
        batcher = req.mv.scheduler
        if not isinstance(batcher, SequenceBatcher):
            return
        seq = req.seq
        items = batcher.end(seq, self.clock.now_ns())
        for p in items:
            self.requests.fail(p.key, TritonError(Code.CANCELLED, CANCELLED))
        self._end_state(req.mv, [seq])
        self.dispatch(req.mv)

    def instance_lost(self, mv: ModelVersion, inst: Instance, how: str) -> None:
        batcher = mv.scheduler
        if not isinstance(batcher, SequenceBatcher):
            return
        reason = lost_message(mv.name, inst.name, how)
        count, queued = batcher.instance_lost(inst.name, reason)
        self._reap_by(batcher.reap_at)
        for p in queued:
            self.requests.fail(p.key, TritonError(Code.UNAVAILABLE, reason(p.key.seq)))
        if count:
            log.error("model '%s' instance '%s' %s: the %d sequence(s) whose state it held are lost",
                      mv.name, inst.name, how, count)


def _shape_key(view: ModelView, msg: Infer) -> tuple:
    """What two requests of one direct batch must share: the shapes of variable-size inputs."""
    variable = [d for d in msg.inputs if d.name in view.inputs and -1 in view.inputs[d.name].dims]
    return tuple(sorted((d.name, tuple(d.shape)) for d in variable))
