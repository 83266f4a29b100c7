"""Metrics, response cache, tracing and logging through the real clients, on one server.

The server runs with the cache on (`identity_cached`: a Python model recording each
execution to a file, and `mlp_onnx` with metric tags), Triton-mode tracing of every request
into indexed files, summaries and the first-response histogram, and a JSON log file. One model
is switched to OpenTelemetry tracing through the settings API; its spans go to a local OTLP/HTTP
receiver decoded with the OpenTelemetry protobufs.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, TritondServer, build_example_repository, http_get, serving, wait_for

CACHED = "identity_cached"
CACHE_BYTES = 4096          # room for a few 1 KiB entries: the eviction test fills it


class OtlpReceiver:
    """An OTLP/HTTP endpoint that keeps every span it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        spans = self.spans = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def recording_model(repo: Path, name: str, record: Path) -> None:
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(ROOT / "tests" / "fixtures" / "recording_model.py", repo / name / "1" / "model.py")
    (repo / name / "config.pbtxt").write_text(f'''
name: "{name}" backend: "python" max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
response_cache {{ enable: true }}
parameters {{ key: "record_file" value: {{ string_value: "{record}" }} }}
''')


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("observe")
    repo = build_example_repository(tmp / "models", ("mlp_onnx", "identity_fp32"))
    with open(repo / "mlp_onnx" / "config.pbtxt", "a") as f:
        f.write('\nresponse_cache { enable: true }\nmetric_tags { key: "team" value: "search" }\n')
    record = tmp / "executions.txt"
    recording_model(repo, CACHED, record)
    otlp = OtlpReceiver()
    try:
        with serving(TritondServer(repo, [
                f"--cache-config=local,size={CACHE_BYTES}",
                f"--trace-config=triton,file={tmp / 'trace.json'}", "--trace-config=level=TIMESTAMPS",
                "--trace-config=rate=1", "--trace-config=triton,log-frequency=1",
                f"--trace-config=opentelemetry,url={otlp.url}", "--trace-config=opentelemetry,bsp_schedule_delay=100",
                "--metrics-config=summary_latencies=true", "--metrics-config=histogram_latencies=true",
                f"--log-file={tmp / 'server.log'}", "--log-format=json"])) as s:
            yield {"server": s, "tmp": tmp, "record": record, "otlp": otlp}
    finally:
        otlp.close()


def scrape(s: TritondServer) -> dict:
    status, body = http_get(f"http://127.0.0.1:{s.metrics_port}/metrics")
    assert status == 200, body
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def value(families: dict, name: str, **labels) -> float:
    family = families[name]
    found = [s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())
             and s.name in (name, name + "_total")]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


def infer(client, model: str, x: np.ndarray, request_id: str = "", headers=None):
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], request_id=request_id, headers=headers).as_numpy("OUTPUT0")


def test_metrics_after_a_known_workload(env):
    s = env["server"]
    client = httpclient.InferenceServerClient(s.http_url)
    families = scrape(s)
    # Loaded models have every family from the start, at zero.
    assert value(families, "nv_inference_request_success", model="identity_fp32", version="1") == 0
    x = np.ones((2, 256), np.float32)
    for _ in range(3):
        infer(client, "identity_fp32", np.arange(4, dtype=np.float32))
    with pytest.raises(Exception):
        infer(client, "identity_fp32", np.arange(4, dtype=np.int32).astype(np.float32).reshape(2, 2))
    infer(client, "mlp_onnx", x)
    families = scrape(s)
    stats = client.get_inference_statistics("identity_fp32")["model_stats"][0]
    ident = {"model": "identity_fp32", "version": "1"}
    for name, kind in [("nv_inference_request_success", "counter"), ("nv_inference_request_failure", "counter"),
                       ("nv_inference_count", "counter"), ("nv_inference_exec_count", "counter"),
                       ("nv_inference_request_duration_us", "counter"), ("nv_inference_queue_duration_us", "counter"),
                       ("nv_inference_compute_infer_duration_us", "counter"),
                       ("nv_inference_pending_request_count", "gauge"), ("nv_inference_queue_summary_us", "summary"),
                       ("nv_inference_first_response_histogram_ms", "histogram"), ("nv_cpu_utilization", "gauge"),
                       ("nv_cpu_memory_total_bytes", "gauge"), ("nv_cache_num_hits_per_model", "counter"),
                       ("tritond_model_restart_count", "counter"), ("tritond_process_resident_memory_bytes", "gauge"),
                       ("tritond_worker_resident_memory_bytes", "gauge"), ("tritond_shm_bytes_in_use", "gauge"),
                       ("tritond_broker_queue_depth", "gauge"), ("tritond_broker_round_trip_seconds", "gauge")]:
        assert families[name].type == kind, name
    assert value(families, "nv_inference_request_success", **ident) == 3 == stats["inference_stats"]["success"]["count"]
    assert value(families, "nv_inference_count", **ident) == 3
    assert value(families, "nv_inference_exec_count", **ident) == 3
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert value(families, "nv_inference_request_failure", reason=reason, **ident) == 0
    assert value(families, "nv_inference_request_duration_us", **ident) == \
        stats["inference_stats"]["success"]["ns"] // 1000 > 0
    assert value(families, "nv_inference_compute_infer_duration_us", **ident) == \
        stats["inference_stats"]["compute_infer"]["ns"] // 1000 > 0
    summary = {sm.name: sm.value for sm in families["nv_inference_queue_summary_us"].samples if sm.labels["model"] ==
               "identity_fp32" and "quantile" not in sm.labels}
    assert summary["nv_inference_queue_summary_us_count"] == 3
    buckets = [sm for sm in families["nv_inference_first_response_histogram_ms"].samples
               if sm.labels["model"] == "identity_fp32" and sm.name.endswith("_count")]
    assert buckets[0].value == 3
    mlp = {"model": "mlp_onnx", "version": "1", "_team": "search"}
    assert value(families, "nv_inference_count", **mlp) == 2          # batch of 2
    assert value(families, "nv_inference_exec_count", **mlp) == 1
    assert value(families, "nv_inference_pending_request_count", **mlp) == 0
    assert value(families, "tritond_worker_resident_memory_bytes", model="mlp_onnx", instance="mlp_onnx_0_0") > 0
    assert 0 <= value(families, "nv_cpu_utilization") <= 1
    # A model that is not cached has no cache families; Triton's counters keep their names.
    assert not [sm for sm in families["nv_cache_num_hits_per_model"].samples if sm.labels["model"] == "identity_fp32"]
    _, raw = http_get(f"http://127.0.0.1:{s.metrics_port}/metrics")
    assert b'\nnv_inference_request_success{model="identity_fp32",version="1"} 3\n' in raw
    assert b"# TYPE nv_inference_request_success counter\n" in raw


def test_cache_hits_never_reach_a_worker(env):
    s, record = env["server"], env["record"]
    client = httpclient.InferenceServerClient(s.http_url)
    x = np.arange(8, dtype=np.float32)
    for i in range(3):
        np.testing.assert_array_equal(infer(client, CACHED, x, request_id=f"hit{i}"), x)
    np.testing.assert_array_equal(infer(client, CACHED, x + 1, request_id="other"), x + 1)
    assert record.read_text().split() == ["hit0", "other"]      # executed once per distinct input
    grpc = grpcclient.InferenceServerClient(s.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [8], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer(CACHED, [inp]).as_numpy("OUTPUT0"), x)
    stats = client.get_inference_statistics(CACHED)["model_stats"][0]
    assert stats["inference_stats"]["cache_hit"]["count"] == 3
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 5
    assert stats["inference_count"] == 2 and stats["execution_count"] == 2
    families = scrape(s)
    labels = {"model": CACHED, "version": "1"}
    assert value(families, "nv_cache_num_hits_per_model", **labels) == 3
    assert value(families, "nv_cache_num_misses_per_model", **labels) == 2
    assert value(families, "nv_cache_hit_duration_per_model", **labels) == \
        stats["inference_stats"]["cache_hit"]["ns"] // 1000
    # LRU by bytes: 4 KiB holds three 1 KiB entries plus alignment; a fourth evicts the oldest.
    big = [np.full(256, i, np.float32) for i in range(5)]
    for i, b in enumerate(big):
        infer(client, CACHED, b, request_id=f"fill{i}")
    infer(client, CACHED, big[-1], request_id="recent")           # a hit
    infer(client, CACHED, big[0], request_id="evicted")           # evicted: executes again
    executed = record.read_text().split()
    assert "recent" not in executed and "evicted" in executed
    assert value(scrape(s), "tritond_cache_evictions") > 0


def test_a_response_larger_than_the_cache_is_answered_and_logged(env):
    s, tmp = env["server"], env["tmp"]
    client = httpclient.InferenceServerClient(s.http_url)
    x = np.arange(2 * CACHE_BYTES // 4, dtype=np.float32)
    np.testing.assert_array_equal(infer(client, CACHED, x, request_id="too-big"), x)
    # tritonserver's words, which L0_response_cache greps for
    wait_for(lambda: any(line["level"] == "ERROR" and line["message"].startswith(f"Failed to insert key [{CACHED}:1:")
                         and "exceed the cache size" in line["message"] for line in log_lines(tmp)), timeout=10)


def test_an_entry_counts_the_description_of_its_outputs(env):
    """1022 floats (4088 bytes) fit the cache's 4 KiB alone, but not with the output's name,
    datatype and shape, which Triton's entries hold too: answered each time, never stored."""
    s, tmp, record = env["server"], env["tmp"], env["record"]
    client = httpclient.InferenceServerClient(s.http_url)
    x = np.arange(1022, dtype=np.float32) + 0.5
    for rid in ("described-1", "described-2"):
        np.testing.assert_array_equal(infer(client, CACHED, x, request_id=rid), x)
    executed = record.read_text().split()
    assert "described-1" in executed and "described-2" in executed
    # 4088 + len("OUTPUT0") + len("FP32") + 8 * (1 dimension + 3 lengths)
    wait_for(lambda: any("4131 bytes exceed the cache size of 4096 bytes" in line["message"]
                         for line in log_lines(tmp)), timeout=10)


def test_trace_files_order_timestamps_across_processes(env):
    s, tmp = env["server"], env["tmp"]
    client = httpclient.InferenceServerClient(s.http_url)
    for i in range(2):
        infer(client, "identity_fp32", np.arange(4, dtype=np.float32), request_id=f"traced{i}")
    expected = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "BATCH_FORMED",
                "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
                "INFER_RESPONSE_COMPLETE", "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    found = {}

    def both_written() -> bool:
        for path in tmp.glob("trace.json.*"):
            records = json.loads(path.read_text())
            heads = {r["id"]: r for r in records if "model_name" in r}
            for tid, head in heads.items():
                if head.get("request_id", "").startswith("traced"):
                    found[head["request_id"]] = [(t["name"], t["ns"]) for r in records if r["id"] == tid
                                                 for t in r.get("timestamps", [])]
        return len(found) >= 2
    wait_for(both_written, 10, lambda: f"both traces in the trace files, found {sorted(found)}")
    assert set(found) == {"traced0", "traced1"}
    for stamps in found.values():
        assert [n for n, _ in stamps] == expected
        times = [t for _, t in stamps]
        assert times == sorted(times), stamps


def test_opentelemetry_export_with_client_context(env):
    s, otlp = env["server"], env["otlp"]
    client = httpclient.InferenceServerClient(s.http_url)
    assert client.update_trace_settings("identity_fp32", {"trace_mode": "opentelemetry"})["trace_mode"] == \
        "opentelemetry"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = "00f067aa0ba902b7"
    # No wait: the broker sends the new gates to every process before it answers the update,
    # on the pipes the request then travels (one HTTP frontend, the broker, the worker).
    try:
        infer(client, "identity_fp32", np.arange(4, dtype=np.float32), request_id="otel",
              headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        wait_for(lambda: any(sp.name == "compute" for sp in otlp.spans), 15, "the compute span to be exported")
    finally:
        client.update_trace_settings("identity_fp32", {"trace_mode": None})
    by_name = {sp.name: sp for sp in otlp.spans if sp.trace_id.hex() == trace_id}
    assert set(by_name) >= {"InferRequest", "identity_fp32", "compute"}, [sp.name for sp in otlp.spans]
    root, model, compute = by_name["InferRequest"], by_name["identity_fp32"], by_name["compute"]
    assert root.parent_span_id.hex() == parent
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert {e.name for e in root.events} >= {"HTTP_RECV_START", "HTTP_SEND_END"}
    assert {e.name for e in compute.events} == {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                                                "COMPUTE_END"}
    attrs = {a.key: a.value for a in model.attributes}
    assert attrs["triton.request_id"].string_value == "otel"
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano


def log_lines(tmp: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp / "server.log").read_text().splitlines() if line.startswith("{")]


def test_log_settings_reach_workers_and_lines_carry_request_ids(env):
    s, tmp = env["server"], env["tmp"]
    http = httpclient.InferenceServerClient(s.http_url)
    grpc = grpcclient.InferenceServerClient(s.grpc_url)
    x = np.arange(3, dtype=np.float32) + 100
    infer(http, CACHED, x, request_id="quiet")
    # No waits: the broker sends new log settings to the workers before it answers the update,
    # on the pipe it later sends the request on, so the next request's model lines follow them.
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    infer(http, CACHED, x + 1, request_id="loud")
    grpc.update_log_settings({"log_info": False})
    infer(http, CACHED, x + 2, request_id="muted")
    grpc.update_log_settings({"log_info": True, "log_verbose_level": 0})
    lines = log_lines(tmp)
    model_lines = [line for line in lines if line["logger"] == "tritond.model"]
    by_id = {}
    for line in model_lines:
        by_id.setdefault(line.get("request_id"), []).append(line["level"])
    assert by_id["quiet"] == ["INFO"]
    assert by_id["loud"] == ["INFO", "VERBOSE"]
    assert by_id["muted"] == ["VERBOSE"]       # as Triton: verbose lines do not follow log_info
    roles = {line["role"] for line in lines}
    assert {"tritond", "broker", "http"} <= roles and any(r.startswith("worker:") for r in roles)


def test_verbose_http_request_lines_are_tritons(env):
    s, tmp = env["server"], env["tmp"]
    http = httpclient.InferenceServerClient(s.http_url)
    http.update_log_settings({"log_verbose_level": 1})

    def logged() -> bool:
        assert http_get(f"http://{s.http_url}/v2/logging")[0] == 200
        return any(line["message"] == "HTTP request: 0 /v2/logging" for line in log_lines(tmp))
    try:
        # as tritonserver logs each HTTP request at verbose level 1 (its method as libevhtp's number)
        wait_for(logged, timeout=10, every=0.2)
    finally:
        http.update_log_settings({"log_verbose_level": 0})


def holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def test_log_file_reopened_on_sigusr1(env):
    s, tmp = env["server"], env["tmp"]
    log = tmp / "server.log"
    os.replace(log, tmp / "server.log.1")

    def holders() -> list[int]:
        return [pid for pid in s.pids() if holds_open(pid, tmp / "server.log.1")]
    assert holders()
    s.send_signal(signal.SIGUSR1)
    client = httpclient.InferenceServerClient(s.http_url)
    wait_for(log.exists, 10, "the log file to be opened again")
    # The broker's broadcast has reached every process once none writes to the moved file.
    wait_for(lambda: not holders(), 10, lambda: f"every process to let go of the moved file: {holders()}")
    infer(client, CACHED, np.arange(5, dtype=np.float32) + 7, request_id="rotated")
    wait_for(lambda: any(line.get("request_id") == "rotated" for line in log_lines(tmp)), 10,
             "the request's line in the new log file")


def test_v2_advertises_trace_and_logging(env):
    meta = httpclient.InferenceServerClient(env["server"].http_url).get_server_metadata()
    assert {"trace", "logging"} <= set(meta["extensions"])
