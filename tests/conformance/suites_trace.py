"""L0_trace: qa/L0_trace/test.sh, server by server.

Triton mode: the trace files of each server (rates, counts, log frequency, a model's own
settings, BLS and ensemble parents) through qa/common/trace_summary.py, the settings API as
test.sh reads it with curl, and `trace_endpoint_test.py`. OpenTelemetry mode:
`opentelemetry_unittest.py` and test.sh's own checks of the spans an `otelcol` collector writes.
test.sh downloads otelcol; here `standins/otelcol.py` stands in for it (an OTLP/HTTP receiver
writing the collector's file-exporter lines), started as `./otelcol` as the test starts it.
Then the two 120 s stress runs of `trace_stress_grpc_client.py`.

test.sh's simple_http_infer_client and simple_grpc_infer_client (C++ examples) are one
inference of `simple` per protocol through tritonclient.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from suites_decoupled import repeat_non_decoupled
from suites_http import _copytree, _fresh, _sed
from suites_observe import _http, _tests_of, _trace_summary

HERE = Path(__file__).resolve().parent
BASE = "onnx_int32_int32_int32"
ENSEMBLE = "ensemble_add_sub_int32_int32_int32"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
OTLP_URL = "localhost:10000/v1/traces"
STRESS_S = 120.0
CUSTOM_TRACING = ("the C++ identity backend's custom trace activities (TRITONSERVER_InferenceTraceReportActivity); "
                  "tritond's built-in identity backend refuses 'enable_custom_tracing'")
NO_SAGEMAKER = "tritond has no SageMaker endpoint (it refuses --allow-sagemaker=true)"
# opentelemetry_unittest.py's cases recorded skipped here, with why
OTEL_SKIP = {
    "OpenTelemetryTest.test_sagemaker_invocation_trace_simple_model_context_propagation": NO_SAGEMAKER,
    "OpenTelemetryTest.test_sagemaker_invoke_trace_simple_model_context_propagation": NO_SAGEMAKER,
    "OpenTelemetryTest.test_custom_backend_tracing": CUSTOM_TRACING,
    "OpenTelemetryTest.test_custom_backend_tracing_context_propagation": CUSTOM_TRACING,
}
SDK_QUEUE_FULL = "Queue full, dropping"


# ---------------------------------------------------------------------- repository
def _trace_models(qa, d: Path) -> Path:
    """test.sh's trace_models, less custom_identity_int32 (printed); repeat_int32 (decoupled: False)
    is the C++ repeat backend's stand-in, standins/repeat.py."""
    models = _fresh(d / "trace_models")
    (models / "dynamic_batch" / "1").mkdir(parents=True)
    (models / "dynamic_batch" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 1\n'
        'input [{ name: "INPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        'instance_group [{ count: 1 \n kind: KIND_CPU }]\n'
        'dynamic_batching {\n  preferred_batch_size: [ 1 ]\n'
        '  default_queue_policy { timeout_action: REJECT \n default_timeout_microseconds: 1000000 \n '
        'max_queue_size: 8 }\n}\n'
        'parameters [{ key: "execute_delay_ms" \n value: { string_value: "8000" } }]\n')
    for name in ("simple", "global_simple"):
        _copytree(qa.data / "qa_model_repository" / BASE, models / name)
        for v in ("2", "3"):
            shutil.rmtree(models / name / v, ignore_errors=True)
        _sed(models / name / "config.pbtxt", r"(?m)^name:.*", f'name: "{name}"')
    ens = models / ENSEMBLE
    _copytree(qa.data / "qa_ensemble_model_repository" / "qa_model_repository" / "simple_onnx_int32_int32_int32", ens)
    for v in ("2", "3"):
        shutil.rmtree(ens / v, ignore_errors=True)
    (ens / "1").mkdir(exist_ok=True)
    _sed(ens / "config.pbtxt", r"(?m)^name:.*", f'name: "{ENSEMBLE}"')
    _sed(ens / "config.pbtxt", r"model_name:.*", 'model_name: "simple"')
    _copytree(d / "models" / "input_all_required", models / "input_all_required")
    (models / "bls_simple" / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "bls_simple" / "bls_simple.py", models / "bls_simple" / "1" / "model.py")
    (models / "identity_fp32" / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "identity_fp32" / "model.py", models / "identity_fp32" / "1")
    shutil.copy(qa.qa / "python_models" / "identity_fp32" / "config.pbtxt", models / "identity_fp32")
    repeat_non_decoupled(qa, models, "repeat_int32", "model_transaction_policy {\n  decoupled: False\n}\n")
    print(f"  (left out of trace_models: custom_identity_int32 except for its own server ({CUSTOM_TRACING}): it "
          f"would stop a server that loads every model)", flush=True)
    return models


def _custom_identity(models: Path, extra: str = "") -> None:
    """test.sh's custom_identity_int32 (the identity backend with custom tracing on)."""
    m = _fresh(models / "custom_identity_int32")
    (m / "1").mkdir()
    (m / "config.pbtxt").write_text(
        'name: "custom_identity_int32"\nbackend: "identity"\nmax_batch_size: 1024\n'
        'input [{ name: "INPUT0" \n data_type: TYPE_INT32 \n dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" \n data_type: TYPE_INT32 \n dims: [ -1 ] }]\n'
        'instance_group [{ kind: KIND_CPU }]\n'
        'parameters [{ key: "execute_delay_ms" \n value: { string_value: "500" } }, '
        '{ key: "enable_custom_tracing" \n value: { string_value: "true" } }' + extra + ']\n')


# ---------------------------------------------------------------------- helpers
def _settings(level: str, rate: str, count: str = "", freq: str = "", file: str = "", mode: str = "triton") -> list[str]:
    """The fragments test.sh greps in a trace settings answer."""
    out = [f'"trace_level":["{level}"]', f'"trace_rate":"{rate}"', f'"trace_mode":"{mode}"']
    out += [f'"trace_count":"{count}"'] if count else []
    out += [f'"log_frequency":"{freq}"'] if freq else []
    out += [f'"trace_file":"{file}"'] if file else []
    return out


OTEL_SETTINGS_ABSENT = ('"trace_file":', '"log_frequency":')


def _otel_settings(rate: str, count: str) -> list[str]:
    return _settings("TIMESTAMPS", rate, count, mode="opentelemetry") + [
        f'"url":"{OTLP_URL}"', '"bsp_max_export_batch_size":"512"', '"bsp_schedule_delay":"5000"',
        '"bsp_max_queue_size":"2048"']


def _lines_with(text: str, fragment: str) -> int:
    """grep -c: the lines that hold `fragment`."""
    return sum(1 for line in text.splitlines() if fragment in line)


def _api(qa, case: str, method: str, path: str, body: str | None = None, ok: bool = True,
         present: list[str] | tuple[str, ...] = (), absent: tuple[str, ...] = ()) -> None:
    """One curl of test.sh: assert_curl_success/failure, then its greps (each line count 1, or 0)."""
    code, text = _http(method, path, body if body is not None else ("" if method == "POST" else None))
    wrong = [f"HTTP {code}"] if (code == 200) != ok else []
    wrong += [f"{f} x{_lines_with(text, f)}" for f in present if _lines_with(text, f) != 1]
    wrong += [f"{f} present" for f in absent if _lines_with(text, f)]
    qa.check(case, not wrong, f"{', '.join(wrong)}: {text[:400]}")


def _send(qa, case: str, rounds: int) -> None:
    """send_inference_requests: `rounds` times one inference of `simple` over HTTP, then gRPC."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    failed = []
    for _ in range(rounds):
        for mod, url in ((httpclient, "localhost:8000"), (grpcclient, "localhost:8001")):
            try:
                inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                result = mod.InferenceServerClient(url).infer("simple", inputs)
                if not ((result.as_numpy("OUTPUT0") == a + b).all() and (result.as_numpy("OUTPUT1") == a - b).all()):
                    failed.append(f"{url}: wrong sum or difference")
            except Exception as e:  # noqa: BLE001 - the client's failure is the case's result
                failed.append(f"{url}: {type(e).__name__}: {e}")
    qa.check(f"simple clients over HTTP and gRPC, {rounds} rounds [{case}]", not failed, "; ".join(failed[:2]))


def _bls(qa, d: Path, context: bool = False) -> None:
    """`python -c 'import opentelemetry_unittest; ...send_bls_request(...)'` (test.sh ignores its status)."""
    headers = f', headers={{"traceparent": "{TRACEPARENT}"}}' if context else ""
    code = f'import opentelemetry_unittest; opentelemetry_unittest.send_bls_request(model_name="{ENSEMBLE}"{headers})'
    with open(qa.results / f"{qa.suite}.client.log", "a") as out:
        subprocess.run([sys.executable, "-c", code], cwd=d, stdout=out, stderr=subprocess.STDOUT, timeout=120)


def _summary(qa, d: Path, trace: str, computes: int, lines: dict[str, int]) -> None:
    """trace_summary.py of one file: its COMPUTE_INPUT_END count and `^model` line counts."""
    text = _trace_summary(qa, d, trace)
    n = text.count("COMPUTE_INPUT_END")
    qa.check(f"{computes} COMPUTE_INPUT_END in {trace}'s summary", n == computes, f"{n} found")
    for model, want in lines.items():
        m = sum(1 for line in text.splitlines() if line.startswith(model))
        qa.check(f"{want} '{model}' lines in {trace}'s summary", m == want, f"{m} found")


def _server(qa, d: Path, args: str, log: str):
    server = qa.start(d, args, log)
    if server is None:
        qa.check(f"server starts [{log}]", False, qa.last_start_error)
    return server


class _Collector:
    """`$OTEL_COLLECTOR --config ./trace-config.yaml >> $OTEL_COLLECTOR_LOG 2>&1 &`, and its kill."""

    def __init__(self, qa, d: Path) -> None:
        self.log = open(qa.results / f"{qa.suite}.trace_collector_exporter.log", "a")
        self.proc = subprocess.Popen([str(d / "otelcol"), "--config", "./trace-config.yaml"], cwd=d,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _install_otelcol(d: Path) -> None:
    """./otelcol runs the stand-in collector with this interpreter (exec: the test kills its pid)."""
    script = d / "otelcol"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "standins" / "otelcol.py"} "$@"\n')
    script.chmod(0o755)


def _collected(d: Path) -> str:
    path = d / "collected_traces.json"
    return path.read_text(errors="replace") if path.exists() else ""


def _clean(d: Path) -> None:
    """test.sh's `rm -f *.log *.log.*` and the collector's files."""
    for pattern in ("*.log", "*.log.*", "collected_traces.json*", "trace", "trace.*"):
        for f in d.glob(pattern):
            f.unlink()


# ---------------------------------------------------------------------- triton mode
def _off_to_min(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config triton,file=trace_off_to_min.log --trace-config level=OFF "
                       f"--trace-config rate=1 {repo}", "inference_server_off.log")
    if s is None:
        return
    _api(qa, "global update OFF -> TIMESTAMPS", "POST", "/v2/trace/setting", '{"trace_level":["TIMESTAMPS"]}',
         present=_settings("TIMESTAMPS", "1", freq="0", file="trace_off_to_min.log"))
    _send(qa, "off_to_min", 10)
    s.stop()
    _summary(qa, d, "trace_off_to_min.log", 20, {"simple": 20})


def _model_frequency(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config triton,file=global_trace.log --trace-config level=TIMESTAMPS "
                       f"--trace-config rate=6 {repo}", "inference_server_model_setting.log")
    if s is None:
        return
    _api(qa, "simple: trace_file not updatable", "POST", "/v2/models/simple/trace/setting",
         '{"trace_file":"global_trace.log"}', ok=False,
         present=['"error":"trace file location can not be updated through network protocol"'])
    _api(qa, "simple: log_frequency 2", "POST", "/v2/models/simple/trace/setting", '{"log_frequency":"2"}',
         present=_settings("TIMESTAMPS", "6", "-1", "2", "global_trace.log"))
    _send(qa, "model log_frequency", 10)
    s.stop()
    qa.check("no simple_trace.log", not (d / "simple_trace.log").exists(), "simple_trace.log written")
    _summary(qa, d, "global_trace.log.0", 2, {"simple": 2})
    _summary(qa, d, "global_trace.log.1", 1, {"simple": 1})


def _update_and_clear(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config triton,file=global_trace.log --trace-config level=TIMESTAMPS "
                       f"--trace-config rate=6 {repo}", "inference_server_update.log")
    if s is None:
        return
    path = "/v2/models/simple/trace/setting"
    _api(qa, "simple: trace_rate 1", "POST", path, '{"trace_rate":"1"}')
    _api(qa, "simple: trace_level OFF", "POST", path, '{"trace_level":["OFF"]}',
         present=_settings("OFF", "1", "-1", "0", "global_trace.log"))
    _send(qa, "simple traced OFF", 10)
    _api(qa, "simple: trace_level cleared", "POST", path, '{"trace_level":null}',
         present=_settings("TIMESTAMPS", "1", "-1", "0", "global_trace.log"))
    _send(qa, "simple on the global level", 5)
    s.stop()
    qa.check("no update_trace.log", not (d / "update_trace.log").exists(), "update_trace.log written")
    _summary(qa, d, "global_trace.log", 10, {"simple": 10})


def _trace_count(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config triton,file=global_count.log --trace-config level=TIMESTAMPS "
                       f"--trace-config rate=1 {repo}", "inference_server_count.log")
    if s is None:
        return
    _send(qa, "before trace_count", 10)
    path = "/v2/models/simple/trace/setting"
    _api(qa, "simple: trace_count -1", "GET", path, present=_settings("TIMESTAMPS", "1", "-1", "0", "global_count.log"))
    _api(qa, "global: trace_count 5", "POST", "/v2/trace/setting", '{"trace_count":"5"}',
         present=_settings("TIMESTAMPS", "1", "5", "0", "global_count.log"))
    _send(qa, "with trace_count 5", 10)
    _api(qa, "simple: trace_count used up", "GET", path,
         present=_settings("TIMESTAMPS", "1", "0", "0", "global_count.log"))
    qa.check("global_count.log.0 written when the count reached 0", (d / "global_count.log.0").exists(),
             "not written before the server stopped")
    for setting in ("trace_count", "trace_rate", "log_frequency"):
        _api(qa, f"simple: {setting} out of range refused", "POST", path, f'{{"{setting}":"10000000000"}}', ok=False)
    s.stop()
    _summary(qa, d, "global_count.log", 20, {"simple": 20})
    _summary(qa, d, "global_count.log.0", 5, {"simple": 5})


def _bls_triton(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config=triton,file=bls_trace.log --trace-config=level=TIMESTAMPS "
                       f"--trace-config=rate=4 --trace-config=count=6 --trace-config=mode=triton {repo}",
                "inference_server_trace_config.log")
    if s is None:
        return
    _api(qa, "--trace-config settings", "GET", "/v2/models/simple/trace/setting",
         present=_settings("TIMESTAMPS", "4", "6", "0", "bls_trace.log"))
    for _ in range(4):
        _bls(qa, d)
    s.stop()
    _summary(qa, d, "bls_trace.log", 2, {ENSEMBLE: 1, "simple": 1})
    text = (d / "bls_trace.log").read_text() if (d / "bls_trace.log").exists() else ""
    qa.check("2 parent_id fields in bls_trace.log", text.count("parent_id") == 2, f"{text.count('parent_id')} found")


def _model_lifecycle(qa, d: Path, models: Path) -> None:
    s = _server(qa, d, f"--model-control-mode=explicit --model-repository={models}",
                "inference_server_nonexistent_model.log")
    if s is None:
        return
    setting = "/v2/models/{}/trace/setting"
    body = '{"log_frequency":"1"}'
    steps = [("load simple", "POST", "/v2/repository/models/simple/load", None, True),
             ("get for a model that does not exist refused", "GET", setting.format("does-not-exist"), None, False),
             ("update for a model that does not exist refused", "POST", setting.format("does-not-exist"), body, False),
             ("get for a loaded model", "GET", setting.format("simple"), None, True),
             ("update for a loaded model", "POST", setting.format("simple"), body, True),
             ("unload simple", "POST", "/v2/repository/models/simple/unload", None, True),
             ("get for an unloaded model refused", "GET", setting.format("simple"), None, False),
             ("update for an unloaded model refused", "POST", setting.format("simple"), body, False),
             ("load simple again", "POST", "/v2/repository/models/simple/load", None, True),
             ("get for a reloaded model", "GET", setting.format("simple"), None, True),
             ("update for a reloaded model", "POST", setting.format("simple"), body, True)]
    for case, method, path, payload, ok in steps:
        _api(qa, case, method, path, payload, ok=ok)
    s.stop()


def _custom_backend(qa, d: Path, models: Path) -> None:
    _custom_identity(models)
    cases = [f"1 {a} in custom_tracing_triton.log's summary"
             for a in ("CUSTOM_SINGLE_ACTIVITY", "CUSTOM_ACTIVITY_START", "CUSTOM_ACTIVITY_END")]
    s = qa.start(d, f"--model-control-mode=explicit --model-repository={models} --load-model=custom_identity_int32 "
                    f"--trace-config=level=TIMESTAMPS --trace-config=triton,file=custom_tracing_triton.log "
                    f"--trace-config=rate=1 --trace-config=mode=triton", "custom_backend_tracing.log")
    shutil.rmtree(models / "custom_identity_int32")
    if s is None:
        why = f"{CUSTOM_TRACING}: {qa.last_start_error}"
        for case in ["custom_identity_int32 inference", *cases]:
            qa.record("test.sh", case, "skip", why)
        return
    _api(qa, "custom_identity_int32 inference", "POST", "/v2/models/custom_identity_int32/infer",
         '{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,1],"data":[4]}]}')
    s.stop()
    text = _trace_summary(qa, d, "custom_tracing_triton.log")
    for case, activity in zip(cases, ("CUSTOM_SINGLE_ACTIVITY", "CUSTOM_ACTIVITY_START", "CUSTOM_ACTIVITY_END")):
        qa.check(case, _lines_with(text, activity) == 1, f"{_lines_with(text, activity)} found")


# ---------------------------------------------------------------------- OpenTelemetry mode
def _otel_unittest(qa, d: Path, models: Path) -> None:
    (models / "trace_context" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(d / "trace_context.py", models / "trace_context" / "1" / "model.py")
    # in unittest.main's order, as test.sh runs the module (each case's timing follows the last's)
    names = sorted(n for n in _tests_of(d / "opentelemetry_unittest.py") if n not in OTEL_SKIP)
    for name, why in OTEL_SKIP.items():
        qa.record("opentelemetry_unittest.py", name, "skip", why)
    print("  (deviation: the OpenTelemetry server starts without --allow-sagemaker=true and without loading "
          "custom_identity_int32; their cases are recorded skipped)", flush=True)
    loads = " ".join(f"--load-model={m}" for m in ("simple", ENSEMBLE, "input_all_required", "dynamic_batch",
                                                    "bls_simple", "trace_context", "repeat_int32"))
    s = qa.start(d, f"--model-control-mode=explicit {loads} --trace-config=level=TIMESTAMPS --trace-config=rate=1 "
                    f"--trace-config=count=-1 --trace-config=mode=opentelemetry "
                    f"--trace-config=opentelemetry,resource=test.key=test.value "
                    f"--trace-config=opentelemetry,resource=service.name=test_triton "
                    f"--trace-config=opentelemetry,url={OTLP_URL} --model-repository={models}",
                 "inference_server_otel_otelcol_exporter.log")
    qa.unittest(d, "opentelemetry_unittest.py", names, server=s)
    if s is not None:
        s.stop()


def _otel_rate_zero(qa, d: Path, repo: str) -> None:
    (d / "collected_traces.json").unlink(missing_ok=True)
    collector = _Collector(qa, d)
    s = _server(qa, d, f"--trace-config=level=TIMESTAMPS --trace-config=rate=0 --trace-config=count=-1 "
                       f"--trace-config=mode=opentelemetry --trace-config=opentelemetry,url={OTLP_URL} {repo}",
                "inference_server_otel_WAR.log")
    if s is not None:
        _api(qa, "opentelemetry settings, rate 0", "GET", "/v2/models/bls_simple/trace/setting",
             present=_otel_settings("0", "-1"), absent=OTEL_SETTINGS_ABSENT)
        for _ in range(10):
            _bls(qa, d)
        qa.check("rate 0: no spans without a client context", not _collected(d).strip(), _collected(d)[:300])
        _bls(qa, d, context=True)
        time.sleep(20)
        qa.check("rate 0: a request with a client context is traced", bool(_collected(d).strip()), "no spans")
    collector.stop()
    if s is not None:
        s.stop()


def _otel_count(qa, d: Path, repo: str) -> None:
    s = _server(qa, d, f"--trace-config=level=TIMESTAMPS --trace-config=rate=5 --trace-config=count=1 "
                       f"--trace-config=mode=opentelemetry --trace-config=opentelemetry,url={OTLP_URL} {repo}",
                "inference_server_otel_count.log")
    if s is None:
        return
    (d / "collected_traces.json").unlink(missing_ok=True)
    collector = _Collector(qa, d)
    _api(qa, "opentelemetry settings, rate 5 count 1", "GET", "/v2/models/bls_simple/trace/setting",
         present=_otel_settings("5", "1"), absent=OTEL_SETTINGS_ABSENT)
    for _ in range(20):
        _bls(qa, d)
    time.sleep(20)
    text = _collected(d)
    roots, top = _lines_with(text, '"name":"InferRequest"'), _lines_with(text, '"parentSpanId":""')
    qa.check("count 1: one trace", bool(text.strip()) and roots == 1 and top == 1,
             f"{roots} lines with InferRequest, {top} with an empty parentSpanId")
    for _ in range(10):
        _bls(qa, d, context=True)
        _bls(qa, d)
        time.sleep(10)
    time.sleep(5)
    text = _collected(d)
    top, child = _lines_with(text, '"parentSpanId":""'), _lines_with(text, '"parentSpanId":"b7ad6b7169242424"')
    qa.check("count used up: only the 10 requests with a client context traced", top == 1 and child == 10,
             f"{top} lines with an empty parentSpanId, {child} with the client's")
    collector.stop()
    s.stop()


def _bsp(qa, d: Path, repo: str, setting: str, wait: float) -> tuple[str, str] | None:
    """One batch span processor server: one BLS request; the server log and the collected spans."""
    log = f"inference_server_otel_BSP_{setting.rsplit('=', 1)[0]}.log"
    s = _server(qa, d, f"--trace-config=level=TIMESTAMPS --trace-config=rate=1 --trace-config=count=-1 "
                       f"--trace-config=mode=opentelemetry --trace-config=opentelemetry,url={OTLP_URL} "
                       f"--trace-config opentelemetry,{setting} {repo} --log-verbose=1", log)
    if s is None:
        return None
    (d / "collected_traces.json").unlink(missing_ok=True)
    collector = _Collector(qa, d)
    _bls(qa, d)
    time.sleep(wait)
    text = (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
    collected = _collected(d)
    collector.stop()
    s.stop()
    return text, collected


def _bsp_settings(qa, d: Path, repo: str) -> None:
    out = _bsp(qa, d, repo, "bsp_max_queue_size=1", 20)
    if out is not None:
        case = "bsp_max_queue_size=1: 'BatchSpanProcessor queue is full - dropping span.' logged"
        if "BatchSpanProcessor queue is full - dropping span." in out[0]:
            qa.check(case, True)
        elif SDK_QUEUE_FULL in out[0]:
            qa.record("test.sh", case, "skip", "the line is opentelemetry-cpp's (Triton links it); tritond exports "
                                               "with the Python SDK, which logged its own: 'Queue full, dropping ...'")
        else:
            qa.check(case, False, "no queue-full warning in the server log")
    out = _bsp(qa, d, repo, "bsp_schedule_delay=0", 10)
    if out is not None:
        n = out[1].count("scopeSpans")
        qa.check("bsp_schedule_delay=0: spans in more than one batch", n > 1, f"{n} scopeSpans")
    out = _bsp(qa, d, repo, "bsp_max_export_batch_size=1", 10)
    if out is not None:
        n = out[1].count("scopeSpans")
        qa.check("bsp_max_export_batch_size=1: 6 batches of one span", n == 6, f"{n} scopeSpans")


def _pbe_context(qa, d: Path, repo: str) -> None:
    for mode, level, log in (("triton", "TIMESTAMPS", "inference_server_triton_trace_context.log"),
                             ("opentelemetry", "OFF", "inference_server_otel_off_trace_context.log")):
        s = _server(qa, d, f"--trace-config=level={level} --trace-config=rate=1 --trace-config=count=-1 "
                           f"--trace-config=mode={mode} {repo} --log-verbose=1", log)
        if s is None:
            continue
        _api(qa, f"python model's trace context is None [{mode}, {level}]", "POST",
             "/v2/models/trace_context/infer",
             '{"inputs":[{"name":"expect_none","datatype":"BOOL","shape":[1],"data":[true]}]}')
        s.stop()


def _stress(qa, d: Path, models: Path) -> None:
    base = f"--model-control-mode=explicit --model-repository={models} --load-model=identity_fp32"
    runs = (("triton", "--trace-config mode=triton --trace-config triton,file=./trace --trace-config rate=1 "
                       "--trace-config level=TIMESTAMPS"),
            ("opentelemetry", "--trace-config level=TIMESTAMPS --trace-config rate=1 --trace-config mode=opentelemetry "
                              "--trace-config opentelemetry,resource=test.key=test.value "
                              "--trace-config opentelemetry,resource=service.name=test_triton "
                              f"--trace-config opentelemetry,url={OTLP_URL}"))
    for mode, args in runs:
        s = _server(qa, d, f"{base} {args}", f"inference_server_{mode}_trace_stress.log")
        if s is None:
            continue
        collector = None
        if mode == "opentelemetry":
            (d / "collected_traces.json").unlink(missing_ok=True)
            collector = _Collector(qa, d)
        _stress_client(qa, d, mode)
        if collector is not None:
            collector.stop()
        qa.check(f"server alive after {STRESS_S:g} s of trace_stress_grpc_client.py [{mode}]", s.proc.poll() is None,
                 f"exited with {s.proc.returncode}")
        s.stop()


def _stress_client(qa, d: Path, mode: str) -> None:
    """run_stress_client: the client in a loop for STRESS_S seconds."""
    end = time.monotonic() + STRESS_S
    with open(qa.results / f"{qa.suite}.client_{mode}_trace_stress.log", "a") as out:
        while time.monotonic() < end:
            try:
                subprocess.run([sys.executable, "trace_stress_grpc_client.py"], cwd=d, stdout=out,
                               stderr=subprocess.STDOUT, timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
            time.sleep(0.1)


def l0_trace(qa) -> None:
    d = qa.qa / "L0_trace"
    _clean(d)
    print("  (stand-in: test.sh downloads otelcol 0.91.0; tests/conformance/standins/otelcol.py receives OTLP/HTTP "
          "on trace-config.yaml's endpoint and writes the file exporter's collected_traces.json)", flush=True)
    _install_otelcol(d)
    models = _trace_models(qa, d)
    repo = f"--model-repository={models}"
    _off_to_min(qa, d, repo)
    _model_frequency(qa, d, repo)
    _update_and_clear(qa, d, repo)
    _trace_count(qa, d, repo)
    s = qa.start(d, f"--trace-config triton,file=global_unittest.log --trace-config level=TIMESTAMPS "
                    f"--trace-config rate=1 {repo}", "inference_server_unittest.log")
    qa.unittest(d, "trace_endpoint_test.py", [], server=s)
    if s is not None:
        s.stop()
    _bls_triton(qa, d, repo)
    _model_lifecycle(qa, d, models)
    _custom_backend(qa, d, models)
    _otel_unittest(qa, d, models)
    _otel_rate_zero(qa, d, repo)
    _otel_count(qa, d, repo)
    _bsp_settings(qa, d, repo)
    _pbe_context(qa, d, repo)
    _stress(qa, d, models)
