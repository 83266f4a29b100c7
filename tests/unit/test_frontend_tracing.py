"""The OpenTelemetry spans a frontend exports for a traced request: which timestamps go on which
span (Triton's layout, which L0_trace's opentelemetry_unittest.py checks event by event), an
ensemble's steps below it, a request its client cancelled, and the exporter settings taken as
tritonserver takes them."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is installed by scripts/setup.sh --test")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from tritond.frontend.broker_client import BrokerClient  # noqa: E402
from tritond.frontend.tracing import FrontendTracer, Pending, batch_settings, endpoint  # noqa: E402
from tritond.wire import schema as S  # noqa: E402
from tritond.wire.options import OtelConfig  # noqa: E402

COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def in_memory() -> tuple[FrontendTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracer = FrontendTracer(client=None)
    provider = TracerProvider(id_generator=tracer._ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer._provider, tracer._tracer = provider, provider.get_tracer("test")
    return tracer, exporter


def stamps(*names: str, start: int = 100) -> list[S.Stamp]:
    return [S.Stamp(name, start + i) for i, name in enumerate(names)]


def events(span) -> list[str]:
    return [e.name for e in span.events]


def test_each_timestamp_goes_on_the_span_triton_puts_it_on():
    tracer, exporter = in_memory()
    info = S.TraceInfo(1, stamps("HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "BATCH_FORMED",
                                 *COMPUTE, "INFER_RESPONSE_COMPLETE", "REQUEST_END"))
    tracer.finish(info, Pending("HTTP", "opentelemetry"), "simple", 1, "", 200, 201)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert events(spans["InferRequest"]) == ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE",
                                             "HTTP_SEND_START", "HTTP_SEND_END"]
    assert events(spans["simple"]) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert events(spans["compute"]) == list(COMPUTE)


def test_the_context_a_model_is_told_is_its_requests_span():
    tracer, exporter = in_memory()
    pending = Pending("HTTP", "opentelemetry", "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01")
    told = json.loads(pending.start().context)["traceparent"]      # what request.trace().get_context() holds
    info = S.TraceInfo(1, stamps("HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "REQUEST_END"))
    tracer.finish(info, pending, "m", 1, "", 200, 201)
    span = next(s for s in exporter.get_finished_spans() if s.name == "m")
    assert told == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"
    assert told.startswith("00-0af7651916cd43dd8448eb211c12666c-")        # the client's trace
    assert Pending("HTTP", "triton").start().context == ""


def test_an_ensembles_steps_are_spans_below_their_parents():
    tracer, exporter = in_memory()
    info = S.TraceInfo(1, stamps("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START",
                                 "INFER_RESPONSE_COMPLETE", "REQUEST_END"), [
        # an inner ensemble's step ends (and is listed) before the inner ensemble itself
        S.TraceChild(3, 2, "simple", 1, stamps("REQUEST_START", "QUEUE_START", *COMPUTE, "REQUEST_END", start=120)),
        S.TraceChild(2, 1, "inner", 1, stamps("REQUEST_START", "QUEUE_START", "REQUEST_END", start=110))])
    tracer.finish(info, Pending("GRPC", "opentelemetry"), "outer", 1, "r", 200, 201)
    spans = exporter.get_finished_spans()
    names = {s.context.span_id: s.name for s in spans}
    assert {s.name: names.get(s.parent.span_id) if s.parent else None for s in spans} == {
        "InferRequest": None, "outer": "InferRequest", "inner": "outer", "simple": "inner", "compute": "simple"}
    inner = next(s for s in spans if s.name == "inner")
    assert events(inner) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert (inner.attributes["triton.trace_id"], inner.attributes["triton.trace_parent_id"]) == (2, 1)


def test_the_exporter_starts_with_the_server_in_opentelemetry_mode():
    # tritonserver's batch span processor exports every schedule delay from startup, not from
    # the first traced request
    tracer = FrontendTracer(client=None, otel=OtelConfig(url="127.0.0.1:9/v1/traces"))
    tracer.start_exporter()
    try:
        assert tracer._tracer is not None
    finally:
        tracer.close()


def test_exporter_settings_are_taken_as_tritonserver_takes_them():
    assert endpoint("localhost:10000/v1/traces") == "http://localhost:10000/v1/traces"
    assert endpoint("https://collector:4318/v1/traces") == "https://collector:4318/v1/traces"
    # opentelemetry-cpp exports spans as they end with a 0 ms delay; the Python SDK refuses 0
    assert batch_settings(OtelConfig(bsp_schedule_delay=0)) == {
        "max_queue_size": 2048, "schedule_delay_millis": 1, "max_export_batch_size": 1}
    assert batch_settings(OtelConfig(bsp_max_queue_size=1))["max_export_batch_size"] == 1


def test_a_cancelled_requests_spans_have_no_response_or_send_times():
    tracer, exporter = in_memory()
    reply = S.InferReply(7, 1, trace=S.TraceInfo(1, stamps("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START",
                                                           "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END")))
    tracer.cancelled(Pending("GRPC", "opentelemetry"), "queued", "", reply)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"InferRequest", "queued"}        # cancelled in the queue: no compute span
    assert events(spans["InferRequest"]) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    assert events(spans["queued"]) == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]


def test_a_cancelled_triton_mode_trace_is_written_at_once():
    sent = []

    class Client:
        send_quietly = sent.append
    tracer = FrontendTracer(Client())
    tracer.cancelled(Pending("HTTP", "triton"), "m", "", S.InferReply(7, 1, trace=S.TraceInfo(5)))
    assert sent == [S.TraceDone(5, [])]


def test_the_broker_client_hands_a_cancelled_requests_late_reply_to_its_tracer(tmp_path):
    client = BrokerClient(f"ipc://{tmp_path}/nobody.sock", "http")
    got = []
    try:
        client.after_cancel(5, got.append)
        client._reply(S.InferReply(6, 1))           # another orphan: nothing to trace
        late = S.InferReply(5, 1, trace=S.TraceInfo(9))
        client._reply(late)
        assert got == [late] and not client.cancelled_traces
    finally:
        client.close()
