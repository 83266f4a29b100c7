"""Request tracing on a frontend's side: the receive and send timestamps, and OpenTelemetry.

A frontend stamps a request only when the broker says its model is being traced
(`BrokerClient.trace_mode`), so with tracing off a request costs one dictionary lookup. The
broker decides which requests are traced; for one that is, the reply says so:
- mode `triton`: the frontend sends its send timestamps back (`TraceDone`) and the broker
  writes the trace file;
- mode `opentelemetry`: the reply carries every timestamp the broker and the worker took, and
  this frontend exports the spans Triton exports (a root `InferRequest` span with the
  protocol's events, a span named after the model with the request's events, and a `compute`
  span; an ensemble step's request's span below its ensemble's) through the OTLP/HTTP exporter
  of opentelemetry-sdk, as children of the client's W3C `traceparent` when it sent one. The
  SDK is imported on first use.
"""
from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

from tritond.wire import schema as S
from tritond.wire.options import OtelConfig

log = logging.getLogger("tritond.frontend")

SEND = {"HTTP": ("HTTP_SEND_START", "HTTP_SEND_END"), "GRPC": ("GRPC_SEND_START", "GRPC_SEND_END")}
# Where Triton puts each timestamp: the frontend's on the root span, the core's request
# activities on the model's span, the compute activities on its `compute` span. tritond's own
# BATCH_FORMED has no Triton activity: it stays in Triton-mode trace files.
ROOT_EVENTS = {"HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_WAITREAD_START",
               "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END", "INFER_RESPONSE_COMPLETE"}
REQUEST_EVENTS = {"REQUEST_START", "QUEUE_START", "REQUEST_END"}
COMPUTE_EVENTS = {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}


TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


class Pending:
    """A request being stamped: its receive times and the client's trace context. In mode
    opentelemetry the ids of its trace and of its model's span are chosen here, before the
    spans exist, so that the model can be told them (request.trace().get_context())."""
    __slots__ = ("recv_start", "protocol", "traceparent", "mode", "trace_id", "span_id")

    def __init__(self, protocol: str, mode: str, traceparent: str = "") -> None:
        self.recv_start = time.monotonic_ns()
        self.protocol = protocol
        self.mode = mode
        self.traceparent = traceparent if mode == "opentelemetry" else ""
        self.trace_id = self.span_id = 0

    def start(self) -> S.TraceStart:
        context = ""
        if self.mode == "opentelemetry":
            m = TRACEPARENT.fullmatch(self.traceparent)
            self.trace_id = int(m.group(1), 16) if m else 0
            self.trace_id = self.trace_id or random.getrandbits(128) or 1
            self.span_id = random.getrandbits(64) or 1
            context = f'{{"traceparent":"00-{self.trace_id:032x}-{self.span_id:016x}-01"}}'
        return S.TraceStart(self.recv_start, time.monotonic_ns(), self.protocol, bool(self.traceparent), context)


class PlannedIds:
    """The SDK's id generator: the ids a request's model was told (Pending.start), else random."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_ids: list[int] = []

    def generate_trace_id(self) -> int:
        planned, self.trace_id = self.trace_id, 0
        return planned or random.getrandbits(128) or 1

    def generate_span_id(self) -> int:
        return self.span_ids.pop() if self.span_ids else random.getrandbits(64) or 1

    def is_trace_id_random(self) -> bool:
        return True         # a new trace's id is random, planned or not


class FrontendTracer:
    def __init__(self, client: Any, otel: OtelConfig = OtelConfig()) -> None:
        self.client = client
        self.otel_cfg = otel
        self._provider = None
        self._tracer = None
        self._ids = PlannedIds()
        self._offset = time.time_ns() - time.monotonic_ns()    # monotonic -> epoch, as Triton's spans use

    def finish(self, info: S.TraceInfo, pending: Pending, model: str, version: int, request_id: str,
               send_start: int, send_end: int) -> None:
        """The response was sent: complete the trace."""
        names = SEND.get(pending.protocol, SEND["HTTP"])
        sent = [S.Stamp(names[0], send_start), S.Stamp(names[1], send_end)]
        if not info.stamps:
            self.client.send_quietly(S.TraceDone(info.id, sent))
            return
        try:
            self._export(info, pending, model, version, request_id, list(info.stamps) + sent)
        except Exception:       # a broken exporter must not fail requests
            log.exception("exporting an OpenTelemetry trace failed")

    def cancelled(self, pending: Pending, model: str, request_id: str, reply: S.InferReply) -> None:
        """The client went away before its response: as Triton's frontend, no response or send
        times are recorded (the root span has the receive times only)."""
        info = reply.trace
        if not info.stamps:
            self.client.send_quietly(S.TraceDone(info.id, []))
            return
        stamps = [s for s in info.stamps if s.name != "INFER_RESPONSE_COMPLETE"]
        try:
            self._export(info, pending, model, reply.version, request_id, stamps)
        except Exception:       # a broken exporter must not fail requests
            log.exception("exporting an OpenTelemetry trace failed")

    # ---------------------------------------------------------------- OpenTelemetry

    def start_exporter(self) -> None:
        """Create the SDK's provider and batch span processor now (else on the first export):
        the processor exports every schedule delay from its start."""
        if self._tracer is None:
            self._setup()

    def _setup(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        cfg = self.otel_cfg
        resource = Resource.create({"service.name": "triton-inference-server", **cfg.resource})
        self._provider = TracerProvider(resource=resource, id_generator=self._ids)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint(cfg.url)),
                                                             **batch_settings(cfg)))
        self._tracer = self._provider.get_tracer("triton-server")

    def _export(self, info: S.TraceInfo, pending: Pending, model: str, version: int, request_id: str,
                stamps: list[S.Stamp]) -> None:
        from opentelemetry import trace
        from opentelemetry.propagate import extract
        if self._tracer is None:
            self._setup()
        everything = [s.ns for s in stamps] + [s.ns for c in info.children for s in c.stamps]
        parent = extract({"traceparent": pending.traceparent}) if pending.traceparent else None
        self._ids.trace_id = pending.trace_id
        root = self._tracer.start_span("InferRequest", context=parent, start_time=min(everything) + self._offset,
                                       kind=trace.SpanKind.SERVER)
        self._ids.trace_id = 0          # taken from the client's context, when it sent one
        self._ids.span_ids = [pending.span_id] if pending.span_id else []
        for s in stamps:
            if s.name in ROOT_EVENTS:
                root.add_event(s.name, timestamp=s.ns + self._offset)
        contexts = {info.id: self._request_span(trace.set_span_in_context(root), model, version, info.id, 0,
                                                request_id, stamps)}
        for child in sorted(info.children, key=lambda c: c.stamps[0].ns if c.stamps else 0):
            if child.parent_id in contexts:
                contexts[child.id] = self._request_span(contexts[child.parent_id], child.model, child.version,
                                                        child.id, child.parent_id, request_id, child.stamps)
        root.end(end_time=max(everything) + self._offset)

    def _request_span(self, context: Any, model: str, version: int, tid: int, parent_tid: int, request_id: str,
                      stamps: list[S.Stamp]) -> Any:
        """A request's span (named after its model, with its compute span below), as Triton
        starts one at REQUEST_START; returns its context, the parent of its children's spans."""
        from opentelemetry import trace
        at = {s.name: s.ns + self._offset for s in stamps}
        first, last = min(at.values()), max(at.values())
        attributes = {"triton.model_name": model, "triton.model_version": version, "triton.trace_id": tid,
                      "triton.trace_parent_id": parent_tid}
        if request_id:
            attributes["triton.request_id"] = request_id
        span = self._tracer.start_span(model, context=context, start_time=at.get("REQUEST_START", first),
                                       attributes=attributes, kind=trace.SpanKind.SERVER)
        for s in stamps:
            if s.name in REQUEST_EVENTS:
                span.add_event(s.name, timestamp=s.ns + self._offset)
        ctx = trace.set_span_in_context(span)
        if "COMPUTE_START" in at:
            compute = self._tracer.start_span("compute", context=ctx, start_time=at["COMPUTE_START"],
                                              kind=trace.SpanKind.SERVER)
            for s in stamps:
                if s.name in COMPUTE_EVENTS:
                    compute.add_event(s.name, timestamp=s.ns + self._offset)
            compute.end(end_time=at.get("COMPUTE_END", at["COMPUTE_START"]))
        span.end(end_time=at.get("REQUEST_END", last))
        return ctx

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


def endpoint(url: str) -> str:
    """tritonserver takes `--trace-config opentelemetry,url=host:port/path` without a scheme."""
    return url if "://" in url else f"http://{url}"


def batch_settings(cfg: OtelConfig) -> dict[str, int]:
    """The batch span processor's settings for the Python SDK, which refuses 0 where
    opentelemetry-cpp (Triton's) takes it. With a 0 ms schedule delay opentelemetry-cpp's worker
    exports spans as they end; here a request's spans end together, so they go one per batch."""
    queue = max(1, cfg.bsp_max_queue_size)
    batch = 1 if cfg.bsp_schedule_delay == 0 else min(queue, max(1, cfg.bsp_max_export_batch_size))
    return {"max_queue_size": queue, "schedule_delay_millis": max(1, cfg.bsp_schedule_delay),
            "max_export_batch_size": batch}
