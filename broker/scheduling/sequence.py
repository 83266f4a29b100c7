"""The sequence batcher's scheduling: admission with Triton's checks and errors, batches with
the control inputs (START, END, READY, CORRID) and padding the model reads, backlog timeouts,
idle sequences, cancellation, and sequences lost with their worker.

Bookkeeping is in sequence_slots.py; this part turns it into messages. The implicit state
of a sequence lives in the worker that runs it (workers/states.py): an ExecRequest names the
sequence (`seq`) and the worker feeds and keeps the state; the broker tells a worker to free
the state of a sequence that ended without an END request reaching it (idle, cancelled).
"""
from __future__ import annotations

import itertools
import logging
import struct
from collections.abc import Callable

from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError, invalid, request_prefix
from tritond.wire.schema import EndSequences, ExecRequest, Infer, Inline, ModelView, SequenceControl, TensorDesc, Zeros

from tritond.broker.scheduling.batcher import Pending
from tritond.broker.scheduling.policy import Batches
from tritond.broker.scheduling.sequence_slots import BACKLOG_EXPIRED, FLAG_END, FLAG_START, SequenceBatcher, lost_message
from tritond.broker.supervision.pool import Instance, InstanceState
from tritond.broker.tables.inflight import Req
from tritond.broker.tables.model_version import ModelVersion
from tritond.broker.test_hooks import backlog_delay_scheduler, delay_scheduler

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


def check_corrid(msg: Infer, model: str, view: ModelView) -> None:
    """Triton's checks before the sequence batcher (batch size, a correlation id of the type the
    model's CORRID control takes), with its texts; raises INVALID_ARG. An iterative sequence
    model takes a request without one (it starts a sequence of its own)."""
    if view.max_batch_size > 0 and msg.inputs and msg.inputs[0].shape and msg.inputs[0].shape[0] > 1:
        raise invalid(f"inference request to model '{model}' must specify batch-size 1 due to requirements of "
                      f"sequence batcher")
    corrid = msg.correlation_id
    if corrid == 0 or corrid == "":
        if view.sequence.iterative:
            return
        raise invalid(f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID")
    control = view.sequence.controls.get("CORRID")
    if control is not None:
        given = "BYTES" if isinstance(corrid, str) else "UINT64"
        if (given == "BYTES") != (control.datatype == "BYTES"):
            raise invalid(f"{request_prefix(msg.id)}sequence batching control '{control.name}' data-type is "
                          f"'{given}', but model '{model}' expects '{control.datatype}'")


class SequenceScheduling:
    """The sequence batcher as a `Scheduling`: admission with Triton's checks, batches with the
    control inputs, backlog timeouts, idle sequences, cancellation, lost sequences."""

    def __init__(self, mv: ModelVersion, path: Batches) -> None:
        self.batcher = SequenceBatcher(mv.view.sequence, mv.max_batch_size, [i.name for i in mv.instances],
                                       mv.name, delay_scheduler(mv.name), backlog_delay_scheduler(mv.name))
        self.path = path
        self.controls = Controls(mv.view)
        self.name = mv.name
        self.view = mv.view
        self.preserve_ordering = self.batcher.policy.preserve_ordering and not mv.view.decoupled
        self.may_retry = False          # a sequence's state cannot be redone
        # iterative_sequence: a request without a correlation id starts a sequence of its own (ids
        # from the top of the range, away from clients'), and a request the model releases to
        # run again goes back to its sequence; one it releases for good ends the sequence.
        self.iterative = mv.view.sequence.iterative
        self.own_ids = itertools.count((1 << 64) - 1, -1)

    def __len__(self) -> int:
        return len(self.batcher)

    # ---------------------------------------------------------------- admission

    def check(self, msg: Infer) -> None:
        check_corrid(msg, self.name, self.view)

    def admit(self, req: Req, msg: Infer, now_ns: int) -> None:
        if self.iterative and (msg.correlation_id == 0 or msg.correlation_id == ""):
            msg.correlation_id = next(self.own_ids)
            msg.flags |= FLAG_START
        req.pending = Pending(req, now_ns, 1, _shape_key(self.view, msg))
        req.seq = self.batcher.enqueue(req.pending, msg.correlation_id, msg.flags, msg.timeout_us, now_ns)
        self.path.reap_by(self.batcher.reap_at)
        if msg.flags & FLAG_START and len(req.seq.queue) > 1:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", msg.correlation_id, self.name)

    # ---------------------------------------------------------------- batches

    def dispatch(self, mv: ModelVersion) -> None:
        """Look for batches at the end of this loop turn: the requests of many sequences that
        arrive together (their clients got the previous batch's answers at once) share one
        execution, instead of the first one running alone."""
        self.path.at_turn_end(mv)

    def at_turn_end(self, mv: ModelVersion) -> None:
        """Send a batch to every free instance that has one; remember when to look again."""
        batcher = self.batcher
        now = self.path.clock.now_ns()
        for inst in mv.instances:
            if inst.serving and inst.name in batcher.down:
                batcher.instance_up(inst.name, now)
        self.expire(mv, now)
        wake = 0
        for inst in [i for i in mv.instances if i.state is InstanceState.READY]:     # removed ones finish theirs
            entries, at = batcher.next_batch(inst.name, now)
            if entries:
                self._send(mv, inst, entries, now)
            elif at:
                wake = min(wake, at) if wake else at
        self.path.wake_at(mv, wake)

    def _send(self, mv: ModelVersion, inst: Instance, entries: list[Pending | None], now_ns: int) -> None:
        controls = self.controls
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
        self.path.send_batch(mv, inst, reqs, now_ns, execs)

    def finished(self, req: Req, now_ns: int) -> None:
        if req.seq is not None:
            self.batcher.done(req.pending, now_ns)

    def reschedule(self, req: Req, now_ns: int) -> None:
        """Iterative: the model released `req` to run again, as the next request of its sequence
        (neither START nor END); raises Triton's error when the sequence is gone (idle)."""
        self.batcher.done(req.pending, now_ns)
        msg = req.msg
        msg.flags = 0
        req.pending = Pending(req, now_ns, 1, req.pending.shape_key)
        req.seq = self.batcher.enqueue(req.pending, msg.correlation_id, 0, 0, now_ns)
        self.path.reap_by(self.batcher.reap_at)

    def release(self, mv: ModelVersion, req: Req) -> None:
        """Iterative: the model released `req` for good, which ends its sequence (requests of it
        still queued are answered CANCELLED, as Triton's sequence end by cancellation)."""
        seq = req.seq
        if seq is None or seq.ended:
            return
        for p in self.batcher.end(seq, self.path.clock.now_ns()):
            self.path.fail(p.key, TritonError(Code.CANCELLED, REQUEST_CANCELLED), "CANCELED")
        self._end_state(mv, [seq])

    # ---------------------------------------------------------------- timers

    def expire(self, mv: ModelVersion, now_ns: int) -> None:
        batcher = self.batcher
        if batcher.backlog:
            for p in batcher.expire(now_ns):
                self.path.fail(p.key, TritonError(Code.UNAVAILABLE, BACKLOG_EXPIRED))

    def next_deadline(self) -> int:
        return self.batcher.next_deadline()

    def reap(self, mv: ModelVersion, now_ns: int) -> int:
        """Forget idle sequences (their workers free the state)."""
        if not self.batcher.active:
            return 0
        reaped, at = self.batcher.reap(now_ns)
        if reaped:
            self._end_state(mv, reaped)
            self.dispatch(mv)      # backlogged sequences may have taken the slots
        return at

    def _end_state(self, mv: ModelVersion, seqs: list) -> None:
        """Tell each live worker to free the state of these sequences (a worker that never ran
        one ignores its key)."""
        keys = [s.key for s in seqs]
        for inst in mv.instances:
            if inst.serving:
                self.path.send_worker(inst.identity, EndSequences(keys))

    # ---------------------------------------------------------------- cancellation and failures

    def cancel(self, req: Req) -> None:
        """Cancelling a queued request of a sequence cancels the sequence, as in Triton: its
        queued requests are answered CANCELLED and its slot is freed."""
        seq = req.seq
        for p in self.batcher.end(seq, self.path.clock.now_ns()):
            self.path.fail(p.key, TritonError(Code.CANCELLED, REQUEST_CANCELLED), "CANCELED")
        self._end_state(req.mv, [seq])
        self.dispatch(req.mv)

    def extend(self, mv: ModelVersion, inst: Instance, left: int) -> None:
        pass                # a sequence batcher's batches are never serial runs

    def instance_lost(self, mv: ModelVersion, inst: Instance, how: str) -> None:
        reason = lost_message(mv.name, inst.name, how)
        count, queued = self.batcher.instance_lost(inst.name, reason)
        self.path.reap_by(self.batcher.reap_at)
        for p in queued:
            self.path.fail(p.key, TritonError(Code.UNAVAILABLE, reason(p.key.seq)))
        if count:
            log.error("model '%s' instance '%s' %s: the %d sequence(s) whose state it held are lost",
                      mv.name, inst.name, how, count)

    def resized(self, added: list[Instance], removed: list[Instance]) -> None:
        now = self.path.clock.now_ns()
        for inst in added:
            self.batcher.add_instance(inst.name, now)
        for inst in removed:
            self.batcher.close_instance(inst.name)

    def holds(self, inst: Instance) -> bool:
        return self.batcher.holds(inst.name)

    def forget(self, inst: Instance) -> None:
        self.batcher.forget_instance(inst.name)

    def remove(self, pred: Callable[[Pending], bool]) -> list[Pending]:
        return self.batcher.remove(pred)

    def requeue_front(self, item: Pending) -> None:
        raise TritonError(Code.INTERNAL, "a sequence's requests are never retried")

    def note_busy(self, instance: str, ns: int, requests: int = 1, executed_ns: int = 0) -> None:
        pass


def _shape_key(view: ModelView, msg: Infer) -> tuple:
    """What two requests of one direct batch must share: the shapes of variable-size inputs."""
    variable = [d for d in msg.inputs if d.name in view.inputs and -1 in view.inputs[d.name].dims]
    return tuple(sorted((d.name, tuple(d.shape)) for d in variable))
