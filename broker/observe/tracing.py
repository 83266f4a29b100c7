"""Request tracing on the broker's side: which requests are traced, and Triton's trace files.

Settings come from `--trace-config` and the trace settings API (server-wide, or a model's
overrides), applied live. Frontends stamp a request (its receive times) only for the models
the broker says are being traced (`Observe.tracing`), so with tracing off nothing is added
to the hot path. The broker samples here, one counter per setting as Triton has (every
`rate`-th request, `count` traces at most; a request carrying a client's trace context is
always traced in OpenTelemetry mode), and takes its own timestamps and the worker's.

Mode `triton`: the frontend reports its send times (`TraceDone`) and the broker, the one
writer, appends the trace to the file in Triton's JSON layout: with `log_frequency` N, every
N traces go to `<file>.<index>`; a setting whose `count` is used up writes its traces to the
next index file too; what remains at shutdown (or when a setting is replaced) goes to
`<file>.<index>` when a frequency was set, else to `<file>`. Mode `opentelemetry`: the
timestamps (and an ensemble's steps' traces) go back with the reply and the frontend exports
spans (frontend/tracing.py).
Timestamps are CLOCK_MONOTONIC nanoseconds, which every process on the host shares.
"""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec

from tritond.wire.schema import (TRACE_SHARD_SHIFT, BatchDone, Infer, InferReply, Stamp, TraceChild, TraceDone,
                                 TraceInfo, TraceRef)

from tritond.broker.clock import Clock
from tritond.broker.observe.tensor_traces import tensor_record
from tritond.broker.tables.inflight import ReplyTo
from tritond.broker.tables.model_version import ModelVersion

log = logging.getLogger("tritond.broker")

STALE_NS = 10_000_000_000      # a trace whose frontend never reported is written without its send times
RECV = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"), "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")}


class Setting:
    """One scope's effective settings and its sampling state."""

    def __init__(self, values: dict[str, Any], scope: dict[str, Any]) -> None:
        self.values = dict(values)
        self.scope = scope                 # the dict the API shows: the remaining count is kept there
        levels = values.get("trace_level") or ["OFF"]
        self.timestamps = "TIMESTAMPS" in levels
        self.tensors = "TENSORS" in levels            # broker/observe/tensor_traces.py
        self.rate = int(values.get("trace_rate", 1000))
        self.count = int(values.get("trace_count", -1))
        self.log_frequency = int(values.get("log_frequency", 0))
        self.file = str(values.get("trace_file", ""))
        self.mode = str(values.get("trace_mode", "triton"))
        self.sampled = 0
        self.created = 0
        self.collected = 0
        self.stream: list[dict] = []
        self.in_stream = 0

    def mode_if_active(self) -> str:
        """The mode requests are stamped for ('' when nothing can be traced)."""
        if not (self.timestamps or self.tensors) or (self.mode == "triton" and not self.file):
            return ""
        if self.mode == "triton" and (self.count == 0 or self.rate == 0):
            return ""
        return self.mode

    def sample(self, forced: bool) -> bool:
        if self.rate != 0 and self.count != 0:
            self.sampled += 1
            if self.sampled % self.rate == 0:
                if self.count > 0:
                    self.count -= 1
                    # the API shows the remaining count; it is not a new setting
                    self.scope["trace_count"] = self.values["trace_count"] = str(self.count)
                self.created += 1
                return True
        return forced and self.mode == "opentelemetry"


class Trace:
    __slots__ = ("id", "setting", "model", "version", "request_id", "stamps", "born_ns", "parent_id", "root",
                 "children", "ref", "tensors")

    def __init__(self, tid: int, setting: Setting, mv: ModelVersion, request_id: str, now_ns: int,
                 parent_id: int = 0, context: str = "") -> None:
        self.id = tid
        self.ref = TraceRef(tid, context)   # what the model's request.trace() holds
        self.setting = setting
        self.model = mv.name
        self.version = mv.version
        self.request_id = request_id
        self.stamps: list[Stamp] = []
        self.born_ns = now_ns
        self.parent_id = parent_id          # an ensemble step's request: the ensemble request's trace
        self.root = self                    # the client's request's trace, which the frontend exports
        self.children: list[TraceChild] = []    # OpenTelemetry mode: the root's descendants, as they end
        self.tensors: list[dict] = []           # level TENSORS: its tensor records

    def queued(self, msg: Infer) -> None:
        """Level TENSORS: the request's inputs as it enters its model's queue (its client regions
        resolved)."""
        self.tensors += [tensor_record(self.id, "TENSOR_QUEUE_INPUT", d) for d in msg.inputs]

    def compute(self, dispatch_ns: int, done: BatchDone) -> None:
        """The batch this request ran in: when it was formed, and the worker's times."""
        t = done.start_ns
        self.stamps += [Stamp("BATCH_FORMED", dispatch_ns), Stamp("COMPUTE_START", t),
                        Stamp("COMPUTE_INPUT_END", t + done.input_ns),
                        Stamp("COMPUTE_OUTPUT_START", t + done.input_ns + done.infer_ns),
                        Stamp("COMPUTE_END", t + done.input_ns + done.infer_ns + done.output_ns)]


class Tracer:
    def __init__(self, settings: Any, clock: Clock, on_change: Callable[[], None], shard: int = 0) -> None:
        self.settings = settings            # broker/settings.py: the API's dicts
        self.clock = clock
        self.on_change = on_change
        # With several brokers each numbers its traces apart (a frontend routes TraceDone by the
        # id's high bits) and writes its own files, `<file>.broker<N>` beside the first's.
        self.ids = itertools.count((shard << TRACE_SHARD_SHIFT) + 1)
        self.file_suffix = f".broker{shard}" if shard else ""
        self.scopes: dict[str, Setting] = {}
        self.pending: dict[int, Trace] = {}
        self.live: dict[int, Trace] = {}        # traced requests in flight: BLS calls name them as parents
        self.main_files: dict[str, list[dict]] = {}
        self.indexes: dict[str, itertools.count] = {}
        self.reload()

    # ---------------------------------------------------------------- settings

    def _values(self, model: str) -> dict[str, Any]:
        return {**self.settings.trace, **(self.settings.model_trace.get(model, {}) if model else {})}

    def reload(self) -> None:
        """Rebuild the settings whose values changed (a replaced setting writes what it holds)."""
        wanted = {""} | {m for m, v in self.settings.model_trace.items() if v}
        for scope in list(self.scopes):
            if scope not in wanted:
                self._retire(self.scopes.pop(scope))
        for scope in wanted:
            values = self._values(scope)
            old = self.scopes.get(scope)
            if old is not None and old.values == values:
                continue
            if old is not None:
                self._retire(old)
            target = self.settings.model_trace[scope] if scope else self.settings.trace
            self.scopes[scope] = Setting(values, target)

    def gates(self) -> dict[str, str]:
        """Per model with settings of its own (and "" for the rest): the mode to stamp for."""
        return {scope: s.mode_if_active() for scope, s in self.scopes.items()}

    # ---------------------------------------------------------------- requests

    def start(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> tuple[Trace | None, ReplyTo]:
        """Sample a request the frontend stamped; a traced one's reply is wrapped to stamp its end."""
        setting = self.scopes.get(mv.name) or self.scopes[""]
        start = msg.trace
        if not setting.mode_if_active() or not setting.sample(start.forced):
            return None, reply
        now = self.clock.now_ns()
        trace = Trace(next(self.ids), setting, mv, msg.id, now, context=start.context)
        recv_start, recv_end = RECV.get(start.protocol, RECV["HTTP"])
        trace.stamps += [Stamp(recv_start, start.recv_start), Stamp(recv_end, start.recv_end),
                         Stamp("REQUEST_START", now), Stamp("QUEUE_START", now)]
        if setting.count == 0 and setting.mode == "triton":
            self.on_change()        # the last trace of this setting: frontends stop stamping
        self.live[trace.id] = trace

        def end(r: InferReply) -> None:
            self.live.pop(trace.id, None)
            t = self.clock.now_ns()
            trace.stamps += [Stamp("INFER_RESPONSE_COMPLETE", t), Stamp("REQUEST_END", t)]
            if setting.mode == "opentelemetry":
                r.trace = TraceInfo(trace.id, trace.stamps, trace.children)
            else:
                r.trace = TraceInfo(trace.id)
                self.pending[trace.id] = trace
            reply(r)
        return trace, end

    def child(self, parent: Trace, mv: ModelVersion, request_id: str | None = None) -> Trace:
        """The trace of a request an ensemble makes for one of its steps (which has the
        ensemble request's id), as Triton traces it: with its parent, neither sampled nor
        counted apart."""
        now = self.clock.now_ns()
        request_id = parent.request_id if request_id is None else request_id
        trace = Trace(next(self.ids), parent.setting, mv, request_id, now, parent.id)
        trace.root = parent.root
        trace.stamps += [Stamp("REQUEST_START", now), Stamp("QUEUE_START", now)]
        self.live[trace.id] = trace
        return trace

    def bls_child(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> tuple[Trace | None, ReplyTo]:
        """A BLS call a model made with its request's trace (`request.trace()`): traced as that
        request's child while the parent is in flight, as Triton spawns a child trace."""
        parent = self.live.get(msg.parent_trace)
        if parent is None:
            return None, reply
        trace = self.child(parent, mv, msg.id)

        def end(r: InferReply) -> None:
            if not r.more:
                self.end_child(trace)
            reply(r)
        return trace, end

    @staticmethod
    def trace_outputs(trace: Trace, reply: ReplyTo) -> ReplyTo:
        """Level TENSORS: the outputs of each response, through the returned reply (an ensemble's
        too: Triton traces every response it sends as TENSOR_BACKEND_OUTPUT)."""
        def outputs(r: InferReply) -> None:
            if r.error is None:
                trace.tensors += [tensor_record(trace.id, "TENSOR_BACKEND_OUTPUT", d) for d in r.outputs]
            reply(r)
        return outputs

    def end_child(self, trace: Trace) -> None:
        """A step's request answered: its trace goes with its parent's into the file, or (in
        OpenTelemetry mode) with the client's request's reply to the frontend."""
        self.live.pop(trace.id, None)
        t = self.clock.now_ns()
        if trace.setting.mode == "opentelemetry":
            trace.stamps.append(Stamp("REQUEST_END", t))
            trace.root.children.append(TraceChild(trace.id, trace.parent_id, trace.model, trace.version, trace.stamps))
            return
        trace.stamps += [Stamp("INFER_RESPONSE_COMPLETE", t), Stamp("REQUEST_END", t)]
        trace.setting.stream += self.records(trace)

    def done(self, msg: TraceDone) -> None:
        trace = self.pending.pop(msg.id, None)
        if trace is not None:
            trace.stamps += msg.stamps
            self._collect(trace)

    def tick(self, now_ns: int) -> None:
        if self.pending:
            for tid in [t for t, tr in self.pending.items() if now_ns - tr.born_ns > STALE_NS]:
                self._collect(self.pending.pop(tid))

    # ---------------------------------------------------------------- files

    @staticmethod
    def records(trace: Trace) -> list[dict]:
        head: dict[str, Any] = {"id": trace.id, "model_name": trace.model, "model_version": trace.version}
        if trace.request_id:
            head["request_id"] = trace.request_id
        if trace.parent_id:
            head["parent_id"] = trace.parent_id
        stamps = trace.stamps if trace.setting.timestamps else ()
        return [head] + [{"id": trace.id, "timestamps": [{"name": s.name, "ns": s.ns}]} for s in stamps] + trace.tensors

    def _collect(self, trace: Trace) -> None:
        s = trace.setting
        s.stream += self.records(trace)
        s.in_stream += 1
        s.collected += 1
        if (s.count == 0 and s.collected == s.created) or (s.log_frequency and s.in_stream >= s.log_frequency):
            self._write_index(s)

    def _write_index(self, s: Setting) -> None:
        if not s.stream:
            return
        index = next(self.indexes.setdefault(s.file, itertools.count()))
        self._write(f"{s.file}.{index}", s.stream)
        s.stream, s.in_stream = [], 0

    def _retire(self, s: Setting) -> None:
        """A setting replaced or at shutdown: what it still holds goes to its file."""
        for tid in [t for t, tr in self.pending.items() if tr.setting is s]:
            self._collect(self.pending.pop(tid))
        if not s.stream or not s.file:
            return
        if s.log_frequency:
            self._write_index(s)
        else:
            records = self.main_files.setdefault(s.file, [])
            records += s.stream
            s.stream, s.in_stream = [], 0
            self._write(s.file, records)

    def _write(self, path: str, records: list[dict]) -> None:
        path += self.file_suffix
        try:
            # a hidden name beside it, so that no `<file>.*` a reader lists is ever half written
            head, tail = os.path.split(path)
            tmp = os.path.join(head, f".{tail}.tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(msgspec.json.encode(records))
            os.replace(tmp, path)
        except OSError as e:
            log.error("cannot write the trace file %s: %s", path, e.strerror)

    def close(self) -> None:
        for s in self.scopes.values():
            self._retire(s)
