"""The response cache and trace sampling inside the real broker (in-process, fake clock), the
observability flags, and the metrics text format."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from broker_harness import Harness, ensemble_model, python_model
from prometheus_client.parser import text_string_to_metric_families

from tritond.broker.observe.metrics import FIRST_RESPONSE_BUCKETS_MS, latency_factory
from tritond.frontend.metrics import Families, exposition
from tritond import logs
from tritond.options import UsageError, server_options, start_parser
from tritond.wire.options import ServerOptions
from tritond.wire import replies as R
from tritond.wire import schema as S

X = np.arange(4, dtype=np.float32)


PIPE = """
name: "pipe" platform: "ensemble" response_cache { enable: true }
input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "plain" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "OUT" } }
] }
"""


@pytest.fixture
def repo(tmp_path):
    python_model(tmp_path, "m", ["X"], ["Y", "Z"], extra="response_cache { enable: true }")
    python_model(tmp_path, "plain", ["X"], ["Y"])
    ensemble_model(tmp_path, "pipe", PIPE)
    return tmp_path


@pytest.fixture
def harness(repo):
    made = []

    def make(**opts) -> Harness:
        h = Harness(repo, **opts).load("*")
        h.broker.publish_table()
        made.append(h)
        return h
    yield make
    for h in made:
        h.broker.cache.close()


def ask(h: Harness, key: bytes, model: str = "m", rid_id: str = "", outputs=()) -> int:
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, model, -1, [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))],
                            [S.OutputSpec(o) for o in outputs], rid_id, cache_key=key))
    return rid


def execute(h: Harness, model: str = "m") -> S.Exec:
    ((inst, ex),) = h.executing(model)
    h.answer(inst, ex, *[{"Y": S.Inline(b"y" * 16), "Z": S.Inline(b"z" * 16)}] * len(ex.requests))
    return ex


def mv(h: Harness, name: str = "m"):
    (v,) = h.broker.registry.get(name).values()
    return v


def test_a_hit_is_answered_by_the_broker_without_a_worker(harness):
    h = harness(cache_size=1 << 16)
    assert mv(h).view.response_cache and not mv(h, "plain").view.response_cache
    first = ask(h, b"k", outputs=("Y",))
    ex = execute(h)
    assert ex.requests[0].outputs == []          # a miss computes every output for the entry
    sent = len(h.to_workers(S.Exec))
    second = ask(h, b"k", outputs=("Z",))
    assert len(h.to_workers(S.Exec)) == sent     # no worker saw the hit
    hit = h.replies()[second]
    assert {d.name: d.loc.data for d in hit.outputs} == {"Y": b"y" * 16, "Z": b"z" * 16}
    assert h.replies()[first].error is None
    stats = mv(h).stats
    assert (stats.cache_hit.count, stats.cache_miss.count, stats.success.count) == (1, 1, 2)
    assert (stats.inference_count, stats.execution_count) == (1, 1)
    ask(h, b"other")
    execute(h)
    assert mv(h).stats.cache_miss.count == 2


def test_lru_eviction_by_bytes_and_leased_entries(harness):
    h = harness(cache_size=256)
    for key in (b"a", b"b", b"c", b"d"):        # 32-byte entries, 64-byte blocks: the fourth evicts "a"
        ask(h, key)
        execute(h)
    cache = h.broker.cache
    assert cache.evictions >= 1 and (mv(h).name, mv(h).version, b"a") not in cache.entries
    sent = len(h.to_workers(S.Exec))
    ask(h, b"d")
    assert len(h.to_workers(S.Exec)) == sent
    ask(h, b"a")
    assert len(h.to_workers(S.Exec)) == sent + 1


def test_keys_from_models_and_requests_of_other_models_are_not_cached(harness):
    h = harness(cache_size=1 << 16)
    ask(h, b"k", model="plain")
    execute(h, "plain")
    ask(h, b"k", model="plain")
    assert len(h.executing("plain")) == 1
    assert not h.broker.cache.entries


def test_a_reload_invalidates_the_models_entries(harness, repo):
    h = harness(cache_size=1 << 16, model_control_mode="explicit", load_models=["*"])
    ask(h, b"k")
    execute(h)
    assert h.broker.cache.entries
    assert h.control(S.UnloadModel("m")).error is None
    h.broker.publish_table()
    assert not h.broker.cache.entries


def test_an_ensemble_is_cached_as_a_whole(harness):
    h = harness(cache_size=1 << 16)
    assert mv(h, "pipe").view.response_cache       # its step's model need not enable the cache
    ask(h, b"k", model="pipe")
    execute(h, "plain")
    sent = len(h.to_workers(S.Exec))
    rid = ask(h, b"k", model="pipe")
    assert len(h.to_workers(S.Exec)) == sent and h.replies()[rid].outputs[0].name == "OUT"
    assert mv(h, "pipe").stats.cache_hit.count == 1 and mv(h, "plain").stats.success.count == 1


def test_an_ensemble_over_a_decoupled_step_cannot_enable_the_cache(tmp_path):
    python_model(tmp_path, "stream", ["X"], ["Y"], extra="model_transaction_policy { decoupled: true }")
    ensemble_model(tmp_path, "pipe", PIPE.replace('"plain"', '"stream"'))
    h = Harness(tmp_path, cache_size=1 << 16).load("*")
    try:
        pipe = mv(h, "pipe")
        assert pipe.state.name == "UNAVAILABLE"
        assert ("Response Cache does not currently support model pipe with 'decoupled' transaction policy. "
                "Please disable the response cache.") in pipe.reason
    finally:
        h.broker.cache.close()


def test_an_ensemble_steps_request_uses_its_models_cache(tmp_path):
    python_model(tmp_path, "plain", ["X"], ["Y"], extra="response_cache { enable: true }")
    ensemble_model(tmp_path, "pipe", PIPE.replace("response_cache { enable: true }", ""))
    h = Harness(tmp_path, cache_size=1 << 16).load("*")
    try:
        h.broker.publish_table()
        assert not mv(h, "pipe").view.response_cache and mv(h, "plain").view.response_cache
        first = ask(h, b"", model="pipe")       # the ensemble does not enable the cache: no frontend key
        execute(h, "plain")
        sent = len(h.to_workers(S.Exec))
        second = ask(h, b"", model="pipe")
        assert len(h.to_workers(S.Exec)) == sent            # answered from the step model's cache
        assert h.replies()[second].outputs[0].name == "OUT" and h.replies()[first].error is None
        plain = mv(h, "plain").stats
        assert (plain.cache_miss.count, plain.cache_hit.count) == (1, 1)
        assert mv(h, "pipe").stats.cache_hit.count == 0
    finally:
        h.broker.cache.close()


def test_no_flag_means_no_cache(harness):
    h = harness()
    assert not h.broker.cache.enabled and not mv(h).view.response_cache
    ask(h, b"k")
    execute(h)
    ask(h, b"k")
    assert len(h.executing("m")) == 1


def test_trace_sampling_rate_count_and_files(harness, tmp_path):
    trace = {"level": "TIMESTAMPS", "rate": 2, "count": 2, "mode": "triton", "file": str(tmp_path / "t.json"),
             "log_frequency": 0}
    h = harness(trace=trace)
    h.from_frontend(S.Hello(S.PROTOCOL_VERSION, "http", 1))
    observe = [m for _, m in h.to_frontends(S.Observe)]
    assert observe and observe[-1].tracing[""] == "triton"
    for i in range(6):
        rid = next(h.rids)
        h.from_frontend(S.Infer(rid, "plain", -1, [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))],
                                id=f"r{i}", trace=S.TraceStart(1, 2)))
        execute(h, "plain")
        reply = h.replies()[rid]
        if reply.trace is not None:
            h.from_frontend(S.TraceDone(reply.trace.id, [S.Stamp("HTTP_SEND_START", 10**18),
                                                         S.Stamp("HTTP_SEND_END", 10**18 + 1)]))
    records = json.loads((tmp_path / "t.json.0").read_text())
    heads = [r for r in records if "model_name" in r]
    assert [r["request_id"] for r in heads] == ["r1", "r3"]      # every 2nd, 2 at most
    assert h.to_frontends(S.Observe)[-1][1].tracing[""] == ""    # count used up: frontends stop stamping
    assert h.control(S.TraceSettings("", {}), ident=b"fe").result.settings["trace_count"] == "0"


def test_an_ensemble_steps_requests_are_traced_with_their_parent(harness, tmp_path):
    trace = {"level": "TIMESTAMPS", "rate": 1, "count": -1, "mode": "triton", "file": str(tmp_path / "t.json"),
             "log_frequency": 1}
    h = harness(trace=trace)
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "pipe", -1, [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))], id="1",
                            trace=S.TraceStart(1, 2)))
    execute(h, "plain")
    sent = [S.Stamp("HTTP_SEND_START", 1), S.Stamp("HTTP_SEND_END", 2)]
    h.from_frontend(S.TraceDone(h.replies()[rid].trace.id, sent))
    records = json.loads((tmp_path / "t.json.0").read_text())
    heads = [r for r in records if "model_name" in r]
    assert heads == [{"id": 2, "model_name": "plain", "model_version": 1, "request_id": "1", "parent_id": 1},
                     {"id": 1, "model_name": "pipe", "model_version": 1, "request_id": "1"}]
    step = [t["timestamps"][0]["name"] for t in records if t.get("id") == 2 and "timestamps" in t]
    assert step[:2] == ["REQUEST_START", "QUEUE_START"] and "COMPUTE_INPUT_END" in step
    assert step[-2:] == ["INFER_RESPONSE_COMPLETE", "REQUEST_END"]


def test_clearing_a_server_wide_trace_setting_restores_its_startup_value(harness, tmp_path):
    trace = {"level": "TIMESTAMPS", "rate": 1, "count": -1, "mode": "triton", "file": "t.json", "log_frequency": 0}
    h = harness(trace=trace)
    h.control(S.TraceSettings("plain", {"trace_rate": "12"}))
    h.control(S.TraceSettings("", {"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]}))
    settings = h.control(S.TraceSettings("", {"trace_rate": None, "trace_count": None})).result.settings
    assert (settings["trace_rate"], settings["trace_count"], settings["trace_level"]) == ("1", "-1", ["OFF"])
    model = h.control(S.TraceSettings("plain", {"trace_rate": None})).result.settings
    assert (model["trace_rate"], model["trace_level"], model["trace_file"]) == ("1", ["OFF"], "t.json")


OTEL = {"level": "TIMESTAMPS", "rate": 1, "count": -1, "mode": "opentelemetry", "file": "t.json",
        "otel": {"url": "localhost:10000/v1/traces"}}


def test_settings_beyond_an_int32_are_refused_as_tritonserver_refuses_them(harness):
    h = harness()
    for key in ("trace_rate", "trace_count", "log_frequency"):
        reply = h.control(S.TraceSettings("plain", {key: "10000000000"}))
        assert reply.error is not None and "value is out of range" in reply.error.message, reply
    assert h.control(S.TraceSettings("plain", {"trace_rate": str(2 ** 31 - 1)})).error is None


def test_trace_settings_list_what_their_mode_uses_as_tritonserver_answers(harness):
    h = harness(trace={**OTEL, "rate": 0})
    # L0_trace greps these: the url as given, the batch span processor's defaults, no file
    assert h.control(S.TraceSettings("plain", {})).result.settings == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "0", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": "localhost:10000/v1/traces", "bsp_max_queue_size": "2048", "bsp_schedule_delay": "5000",
        "bsp_max_export_batch_size": "512"}
    assert h.control(S.TraceSettings("plain", {"trace_mode": "triton"})).result.settings == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "0", "trace_count": "-1", "log_frequency": "0",
        "trace_file": "t.json", "trace_mode": "triton"}


def test_an_ensembles_steps_go_back_with_its_reply_in_opentelemetry_mode(harness):
    h = harness(trace=OTEL)
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "pipe", -1, [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))], id="1",
                            trace=S.TraceStart(1, 2)))
    execute(h, "plain")
    info = h.replies()[rid].trace
    (step,) = info.children
    assert (step.parent_id, step.model, step.version) == (info.id, "plain", 1)
    names = [s.name for s in step.stamps]
    assert names[:2] == ["REQUEST_START", "QUEUE_START"] and "COMPUTE_START" in names and names[-1] == "REQUEST_END"


def test_a_model_is_told_its_requests_trace_context(harness):
    h = harness(trace=OTEL)
    context = '{"traceparent":"00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"}'
    h.from_frontend(S.Infer(next(h.rids), "plain", -1, [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))],
                            trace=S.TraceStart(1, 2, context=context)))
    ((_, ex),) = h.executing("plain")
    assert ex.requests[0].trace.context == context


def test_a_bls_call_made_with_its_requests_trace_is_traced_as_its_child(harness, tmp_path):
    trace = {"level": "TIMESTAMPS", "rate": 1, "count": -1, "mode": "triton", "file": str(tmp_path / "t.json"),
             "log_frequency": 1}
    h = harness(trace=trace)
    x = [S.TensorDesc("X", "FP32", [4], S.Inline(X.tobytes()))]
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "m", -1, x, id="1", trace=S.TraceStart(1, 2)))
    ((inst, ex),) = h.executing("m")
    parent = ex.requests[0].trace.id       # the worker learns the id of its request's trace
    h.from_worker(inst, S.Infer(7, "plain", -1, x, id="1", parent_trace=parent))
    execute(h, "plain")
    h.answer(inst, ex, {"Y": S.Inline(b"y" * 16), "Z": S.Inline(b"z" * 16)})
    h.from_frontend(S.TraceDone(h.replies()[rid].trace.id, [S.Stamp("HTTP_SEND_START", 1), S.Stamp("HTTP_SEND_END", 2)]))
    heads = [r for r in json.loads((tmp_path / "t.json.0").read_text()) if "model_name" in r]
    assert [(r["model_name"], r.get("parent_id")) for r in heads] == [("plain", parent), ("m", None)]


def test_opentelemetry_flags_are_kept_as_tritonserver_reads_them():
    o = options("--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,url=localhost:10000/v1/traces",
                "--trace-config=opentelemetry,bsp_schedule_delay=0")
    assert (o.trace.otel.url, o.trace.otel.bsp_schedule_delay) == ("localhost:10000/v1/traces", 0)
    # a queue smaller than the default export batch (L0_trace's bsp_max_queue_size=1) is taken
    o = options("--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,bsp_max_queue_size=1")
    assert (o.trace.otel.bsp_max_queue_size, o.trace.otel.bsp_max_export_batch_size) == (1, 512)


def test_trace_settings_of_a_model_that_is_not_ready_are_refused_in_tritons_words(harness):
    h = harness()
    reply = h.control(S.TraceSettings("does-not-exist", {}))
    assert reply.error.code.name == "INVALID_ARG"
    assert reply.error.message == "Request for unknown model : does-not-exist"
    assert h.control(S.TraceSettings("plain", {})).error is None


def test_settings_api_rejects_what_tritond_does_not_do(harness):
    h = harness()
    reply = h.control(S.TraceSettings("", {"trace_level": ["TIMESTAMPS", "TENSORS"]}))
    assert reply.error is None and reply.result.settings["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    reply = h.control(S.TraceSettings("", {"trace_level": ["ALL"]}))
    assert reply.error is not None and reply.error.code.name == "INVALID_ARG"
    reply = h.control(S.TraceSettings("", {"trace_rate": "often"}))
    assert reply.error is not None and reply.error.code.name == "INVALID_ARG"
    reply = h.control(S.LogSettings({"log_format": "json"}))
    assert reply.error is None and reply.result.settings.log_format == "json"
    assert h.to_workers(S.Observe)[-1][1].log.format == "json"


def options(*flags: str) -> ServerOptions:
    return server_options(start_parser().parse_args(["--model-repository", "/m", *flags]))


def test_flags_parse_with_triton_syntax():
    o = options("--cache-config=local,size=1048576", "--trace-config=triton,file=/tmp/t.json",
                "--trace-config=level=TIMESTAMPS", "--trace-config=rate=10", "--metrics-config=summary_latencies=true",
                "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001", "--metrics-interval-ms=500",
                "--log-format=ISO8601", "--log-info=false", "--log-verbose=2")
    assert o.cache_size == 1048576
    assert (o.trace.level, o.trace.rate, o.trace.file) == ("TIMESTAMPS", 10, "/tmp/t.json")
    assert o.metrics.summary_latencies and o.metrics.summary_quantiles == [(0.5, 0.05), (0.99, 0.001)]
    assert o.metrics.interval_ms == 500
    assert (o.log.format, o.log.info, o.log.verbose) == ("ISO8601", False, 2)
    assert options().cache_size == 0 and options("--cache-config=local,size=0").cache_size == 0


@pytest.mark.parametrize("flag", [
    "--cache-config=local,size=-5", "--cache-config=redis,size=10", "--cache-config=size=10",
    "--cache-config=local,bytes=10", "--trace-config=level=ALL", "--trace-config=rate=x",
    "--trace-config=jaeger,url=x", "--metrics-config=model_metrics_mode=x", "--metrics-config=a,b=c",
    "--metrics-config=counter_latencies=maybe", "--metrics-interval-ms=0", "--log-format=xml",
])
def test_bad_flag_values_are_usage_errors(flag):
    with pytest.raises(UsageError):
        options(flag)


def test_file_paths_are_reported_as_given_and_logged_to_where_they_pointed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    o = options("--log-file=server.log", "--trace-config=triton,file=trace.json")
    assert (o.log.file, o.trace.file) == ("server.log", "trace.json")      # what the settings APIs report
    try:
        logs.setup("test", o.log)
        monkeypatch.chdir("/")          # a model's code may move the working directory
        logs.reopen()
        logging.getLogger("tritond.test").warning("still here")
        assert "still here" in (tmp_path / "server.log").read_text()
    finally:
        logs.setup("test")


def test_console_lines_go_where_tritonserver_writes_them(capsys):
    try:
        logs.setup("test")
        log = logging.getLogger("tritond.test")
        log.info("an info line")
        log.warning("a warning line")
        log.error("an error line")
        out, err = capsys.readouterr()
        assert "an info line" in out and "a warning line" not in out and "an error line" not in out
        assert "a warning line" in err and "an error line" in err and "an info line" not in err
    finally:
        logs.setup("test")


def test_batch_span_processor_settings_come_from_the_environment_as_in_tritonserver(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    o = options("--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,bsp_max_queue_size=3000")
    assert (o.trace.otel.bsp_schedule_delay, o.trace.otel.bsp_max_queue_size) == (250, 3000)  # the flag wins
    assert options().trace.otel.bsp_schedule_delay == 5000          # read in opentelemetry mode only
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "bad_value")
    with pytest.raises(UsageError, match='Bad option: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"'):
        options("--trace-config=mode=opentelemetry")
    with pytest.raises(UsageError, match='Bad option: "--trace-config opentelemetry,bsp_schedule_delay"'):
        options("--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,bsp_schedule_delay=x")


def test_quantiles_read_each_number_as_tritonserver_does():
    # std::stod reads the longest number a value starts with (L0_metrics passes "0.1:0.0.1")
    o = options("--metrics-config=summary_quantiles=0.1:0.0.1,0.7:0.01, 0.75:1e-2")
    assert o.metrics.summary_quantiles == [(0.1, 0.0), (0.7, 0.01), (0.75, 0.01)]
    with pytest.raises(UsageError):
        options("--metrics-config=summary_quantiles=0.5:x")


def test_two_caches_are_refused_before_either_is_read():
    with pytest.raises(UsageError, match="found multiple cache configurations, but only a single cache"):
        options("--cache-config=local,size=8192", "--cache-config=redis,key=value")


def test_model_metrics_set_a_models_first_response_buckets():
    make = latency_factory(options("--metrics-config=histogram_latencies=true").metrics)
    own = {"model_metrics": {"metric_control": [{
        "metric_identifier": {"family": "nv_inference_first_response_histogram_ms"},
        "histogram_options": {"buckets": [-1.0, 0.0, 1.0, 2.5]}}]}}
    latency = make(own)
    latency.first_response_ms(2.0)
    snap = latency.first_response_snapshot()
    assert snap.bounds == [-1.0, 0.0, 1.0, 2.5] and snap.counts == [0, 0, 0, 1, 0]
    assert make({}).first_response_snapshot().bounds == list(FIRST_RESPONSE_BUCKETS_MS)
    assert latency_factory(options().metrics) is None


def test_exposition_is_tritons_and_parses():
    f = Families()
    f.add("nv_inference_request_success", "counter", "Number of successful requests", {"model": 'a"b', "version": "1"}, 5)
    f.add("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]", {}, 0.25)
    f.summary("nv_inference_queue_summary_us", "queue", {"model": "m", "version": "1"},
              R.SummarySnapshot(2, 3.5, [(0.5, 1.0)]))
    f.histogram("nv_inference_first_response_histogram_ms", "first", {"model": "m", "version": "1"},
                R.HistogramSnapshot([100.0, 500.0], [1, 0, 2], 900.0))
    text = exposition(f.by_name.values()).decode()
    assert 'nv_inference_request_success{model="a\\"b",version="1"} 5\n' in text
    assert "# TYPE nv_inference_request_success counter\n" in text and "nv_cpu_utilization 0.25\n" in text
    # prometheus-cpp's order, which Triton's qa tests match as text: `le` and `quantile` come last
    assert 'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 3\n' in text
    assert 'nv_inference_queue_summary_us{model="m",version="1",quantile="0.5"} 1\n' in text
    families = {m.name: m for m in text_string_to_metric_families(text)}
    assert families["nv_inference_request_success"].type == "counter"
    assert families["nv_inference_request_success"].samples[0].labels["model"] == 'a"b'
    assert families["nv_inference_queue_summary_us"].type == "summary"
    assert families["nv_inference_first_response_histogram_ms"].type == "histogram"
