"""Request tracing on a frontend's side: the receive and send timestamps, and OpenTelemetry.

A frontend stamps a request only when the broker says its model is being traced
(`BrokerClient.trace_mode`), so with tracing off a request costs one dictionary lookup. The
broker decides which requests are traced; for one that is, the reply says so:
- mode `triton`: the frontend sends its send timestamps back (`TraceDone`) and the broker
  writes the trace file;
- mode `opentelemetry`: the reply carries every timestamp the broker and the worker took, and
  this frontend exports the spans Triton exports (a root `InferRequest` span with the
  protocol's events, a span named after the model with the request's events, and a `compute`
  span) through the OTLP/HTTP exporter of opentelemetry-sdk, as children of the client's
  W3C `traceparent` when it sent one. The SDK is imported on first use.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from tritond.wire import schema as S
from tritond.wire.options import OtelConfig

log = logging.getLogger("tritond.frontend")

SEND = {"HTTP": ("HTTP_SEND_START", "HTTP_SEND_END"), "GRPC": ("GRPC_SEND_START", "GRPC_SEND_END")}
ROOT_EVENTS = {"HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END", "GRPC_WAITREAD_START",
               "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"}
COMPUTE_EVENTS = {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}


class Pending:
    """A request being stamped: its receive times and the client's trace context."""
    __slots__ = ("recv_start", "protocol", "traceparent", "mode")

    def __init__(self, protocol: str, mode: str, traceparent: str = "") -> None:
        self.recv_start = time.monotonic_ns()
        self.protocol = protocol
        self.mode = mode
        self.traceparent = traceparent if mode == "opentelemetry" else ""

    def start(self) -> S.TraceStart:
        return S.TraceStart(self.recv_start, time.monotonic_ns(), self.protocol, bool(self.traceparent))


class FrontendTracer:
    def __init__(self, client: Any, otel: OtelConfig = OtelConfig()) -> None:
        self.client = client
        self.otel_cfg = otel
        self._provider = None
        self._tracer = None
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

    # ---------------------------------------------------------------- OpenTelemetry

    def _setup(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        cfg = self.otel_cfg
        resource = Resource.create({"service.name": "triton-inference-server", **cfg.resource})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=cfg.url), max_queue_size=cfg.bsp_max_queue_size,
            schedule_delay_millis=cfg.bsp_schedule_delay, max_export_batch_size=cfg.bsp_max_export_batch_size))
        self._tracer = self._provider.get_tracer("triton-server")

    def _export(self, info: S.TraceInfo, pending: Pending, model: str, version: int, request_id: str,
                stamps: list[S.Stamp]) -> None:
        from opentelemetry import trace
        from opentelemetry.propagate import extract
        if self._tracer is None:
            self._setup()
        at = {s.name: s.ns + self._offset for s in stamps}
        parent = extract({"traceparent": pending.traceparent}) if pending.traceparent else None
        first = min(at.values())
        last = max(at.values())
        root = self._tracer.start_span("InferRequest", context=parent, start_time=first)
        for s in stamps:
            if s.name in ROOT_EVENTS:
                root.add_event(s.name, timestamp=s.ns + self._offset)
        ctx = trace.set_span_in_context(root)
        span = self._tracer.start_span(model, context=ctx, start_time=at.get("REQUEST_START", first), attributes={
            "triton.model_name": model, "triton.model_version": version, "triton.trace_id": info.id,
            "triton.trace_parent_id": 0, "triton.request_id": request_id})
        for s in stamps:
            if s.name not in ROOT_EVENTS and s.name not in COMPUTE_EVENTS:
                span.add_event(s.name, timestamp=s.ns + self._offset)
        if "COMPUTE_START" in at:
            compute = self._tracer.start_span("compute", context=trace.set_span_in_context(span),
                                              start_time=at["COMPUTE_START"])
            for s in stamps:
                if s.name in COMPUTE_EVENTS:
                    compute.add_event(s.name, timestamp=s.ns + self._offset)
            compute.end(end_time=at.get("COMPUTE_END", at["COMPUTE_START"]))
        span.end(end_time=at.get("REQUEST_END", last))
        root.end(end_time=last)

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
