"""Observability and scheduling suites: L0_metrics, L0_response_cache, L0_response_statistics,
L0_logging, L0_cmdline_trace, L0_rate_limiter, L0_iterative_sequence (L0_trace: suites_trace.py).

What these test.sh files read inside Triton, or need a GPU for, is recorded skipped with the
reason: GPU metrics (utilization, energy, peer-access memory), the pinned-memory pool (tritond
has none; it warns that `--pinned-memory-pool-byte-size` is ignored), the C++ unit tests.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from suites_http import _append, _copytree, _fresh, _sed


def _skip_all(qa, module: str, cases, why: str, variant: str = "") -> None:
    for case in cases:
        qa.record(module, case + (f"[{variant}]" if variant else ""), "skip", why)


def _tests_of(path: Path) -> list[str]:
    """Class.test for every test method of a qa module (to record a module not run)."""
    names, cls = [], ""
    for line in path.read_text().splitlines():
        m = re.match(r"class (\w+)\(", line)
        if m:
            cls = m.group(1)
        m = re.match(r"    def (test\w*)\(", line)
        if m and cls:
            names.append(f"{cls}.{m.group(1)}")
    return names


def _run(qa, d: Path, args: str, log: str, module: str, names: list[str], variant: str = "",
         env: dict[str, str] | None = None) -> None:
    """One test.sh run_server with its python cases, then kill_server."""
    server = qa.start(d, args, log, env=env)
    qa.unittest(d, module, names, variant=variant, env=env, server=server)
    if server is not None:
        server.stop()


# ====================================================================== L0_metrics
NO_PINNED = ("tritond has no pinned-memory pool (nv_pinned_memory_pool_* are Triton's; it ignores the flag with a "
             "warning)")
NO_GPU_METRICS = "GPU metrics (nv_gpu_*, nv_energy_consumption, peer-access memory via nvidia-smi) need a GPU"
NAMESPACE_PATH = ("its expected namespace labels are paths under /opt/tritonserver/qa (Triton's container); "
                  "tritond refuses --model-namespacing=true")


def _log(qa, log: str) -> str:
    path = qa.results / f"{qa.suite}.{log}"
    return path.read_text(errors="replace") if path.exists() else ""


def _metrics_models(qa, d: Path) -> Path:
    """test.sh's models/: libtorch_float32_float32_float32 without labels on KIND_GPU (KIND_CPU here)."""
    models = _fresh(d / "models")
    name = "libtorch_float32_float32_float32"
    src = qa.data / "qa_model_repository" / name
    (models / name).mkdir()
    shutil.copytree(src / "1", models / name / "1")
    shutil.copy(src / "config.pbtxt", models / name)
    cfg = models / name / "config.pbtxt"
    _sed(cfg, r"label_filename:.*", "")
    from suites_models import _gpu_count
    kind = "KIND_GPU" if _gpu_count() else "KIND_CPU"
    if kind == "KIND_CPU":
        print(f"  (deviation: {name}: KIND_GPU -> KIND_CPU, no GPU on this host)", flush=True)
    _append(cfg, f"instance_group [{{ kind: {kind} }}]")
    return models


def _queue_size_models(d: Path) -> Path:
    """test.sh's queue_size_models: identity_delay under each scheduler, and an ensemble."""
    models = _fresh(d / "queue_size_models")
    default = models / "default"
    _copytree(d / "identity_delay", default)
    (default / "1").mkdir(exist_ok=True)
    _sed(default / "config.pbtxt", r"(?m)^max_batch_size.*", "max_batch_size: 4")
    delay = 100000
    tails = {
        "dynamic": f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}",
        "max_queue_size": f"dynamic_batching {{ max_queue_delay_microseconds: {delay} "
                          "default_queue_policy { max_queue_size: 4 } }",
        "sequence_direct": f"sequence_batching {{ direct {{ max_queue_delay_microseconds: {delay}, "
                           "minimum_slot_utilization: 1.0 } }",
        "sequence_oldest": f"sequence_batching {{ oldest {{ max_queue_delay_microseconds: {delay}, "
                           "max_candidate_sequences: 4 } }",
    }
    for name, tail in tails.items():
        _copytree(default, models / name)
        _append(models / name / "config.pbtxt", "\n" + tail + "\n")
    _copytree(d / "ensemble_delay", models / "ensemble")
    (models / "ensemble" / "1").mkdir(exist_ok=True)
    _copytree(default, models / "default_composing")
    _copytree(models / "dynamic", models / "dynamic_composing")
    return models


def l0_metrics(qa) -> None:
    d = qa.qa / "L0_metrics"
    print("  (not run: metrics_api_test, the core's C++ unit test)", flush=True)
    config_test = "metrics_config_test.py"
    models = _metrics_models(qa, d)
    base = f"--model-repository={models}"

    # CPU / RAM metrics
    _run(qa, d, f"{base} --metrics-interval-ms=1000 --log-verbose=1", "cpu_metrics_test_server.log",
         "cpu_metrics_test.py", [])

    # pinned memory pool: tritond has none
    qa.record(config_test, "MetricsConfigTest.test_pinned_memory_metrics_exist", "skip", NO_PINNED)
    pinned = _tests_of(d / "pinned_memory_metrics_test.py")
    _skip_all(qa, "pinned_memory_metrics_test.py", pinned, NO_PINNED)
    _skip_all(qa, "pinned_memory_metrics_test.py", pinned, NO_PINNED, "custom_pool")
    _skip_all(qa, "test.sh", ["GPU peer access: no GPU memory with --enable-peer-access=FALSE",
                              "nv_gpu_utilization for 2 GPUs", "nv_gpu_utilization for 1 GPU",
                              "nv_energy_consumption updated every --metrics-interval-ms"], NO_GPU_METRICS)

    # metric config flags and metric types
    unit = d / "unit_test_models"
    for name in ("identity_cache_on", "identity_cache_off"):
        (unit / name / "1").mkdir(parents=True, exist_ok=True)
    base = f"--model-repository={unit} --model-control-mode=explicit"
    cache_missing = ["test_cache_counters_missing", "test_cache_summaries_missing"]
    runs = [
        ("default", "--load-model=identity_cache_off",
         ["test_inf_counters_exist", "test_inf_histograms_missing", "test_inf_summaries_missing", *cache_missing]),
        ("histogram", "--load-model=identity_cache_off --metrics-config histogram_latencies=true",
         ["test_inf_counters_exist", "test_inf_histograms_exist", "test_inf_summaries_missing", *cache_missing]),
        ("summary", "--load-model=identity_cache_off --metrics-config summary_latencies=true",
         ["test_inf_counters_exist", "test_inf_summaries_exist", *cache_missing]),
        ("summary_no_counters", "--load-model=identity_cache_off --metrics-config summary_latencies=true "
         "--metrics-config counter_latencies=false",
         ["test_inf_counters_missing", "test_inf_summaries_exist", *cache_missing]),
        ("cache", "--cache-config local,size=1048576 --load-model=identity_cache_on --metrics-config "
         "summary_latencies=true --metrics-config counter_latencies=true",
         ["test_inf_counters_exist", "test_inf_summaries_exist_with_cache", "test_cache_counters_exist",
          "test_cache_summaries_exist"]),
    ]
    for variant, extra, names in runs:
        # test.sh runs each case as its own `python3 metrics_config_test.py Class.test` against one server
        _run(qa, d, f"{base} {extra}", f"{variant}.server.log", config_test,
             [f"MetricsConfigTest.{n}" for n in names], variant)
    quantiles = "0.1:0.0.1,0.7:0.01,0.75:0.01"
    _run(qa, d, f"{base} --load-model=identity_cache_off --metrics-config summary_latencies=true "
                f"--metrics-config summary_quantiles={quantiles}", "quantiles.server.log", config_test,
         ["MetricsConfigTest.test_summaries_custom_quantiles"], "quantiles", env={"SUMMARY_QUANTILES": quantiles})

    # model namespacing
    repos = d / "model_namespacing_repos"
    for r, e in (("addsub_repo", "addsub_ensemble"), ("subadd_repo", "subadd_ensemble")):
        (repos / r / e / "1").mkdir(parents=True, exist_ok=True)
    qa.record(config_test, "MetricsConfigTest.test_model_namespacing_label_with_namespace_on", "skip", NAMESPACE_PATH)
    _run(qa, d, f"--model-repository={repos}/addsub_repo --model-namespacing=false --allow-metrics=true",
         "namespace_off.server.log", config_test, ["MetricsConfigTest.test_model_namespacing_label_with_namespace_off"])

    # pending request count (queue size)
    qmodels = _queue_size_models(d)
    _run(qa, d, f"--model-repository={qmodels} --log-verbose=1", "queue_size.server.log",
         "metrics_queue_size_test.py", [], env={"MAX_BATCH_SIZE": "4", "MAX_QUEUE_DELAY_US": "100000"})

    # histograms through a decoupled ensemble
    ens = d / "ensemble_decoupled"
    (ens / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
    _copytree(ens / "async_execute_decouple", ens / "async_execute")
    _sed(ens / "async_execute" / "config.pbtxt", r"model_transaction_policy \{ decoupled: True \}", "")
    server = qa.start(d, f"--model-repository={ens} --metrics-config histogram_latencies=true --log-verbose=1",
                      "histogram_ensemble_decoupled_server.log")
    qa.unittest(d, "histogram_metrics_test.py", ["TestHistogramMetrics.test_ensemble_decoupled"], server=server)
    if server is not None:
        server.stop()

    # model_metrics: a histogram's buckets set in the model config
    mm = d / "model_metrics_model"
    model = "async_execute_decouple"
    _fresh(mm / model / "1")
    src = qa.qa / "python_models" / model
    shutil.copy(src / "model.py", mm / model / "1")
    shutil.copy(src / "config.pbtxt", mm / model)
    _append(mm / model / "config.pbtxt",
            'model_metrics {\n  metric_control: [\n    {\n      metric_identifier: {\n'
            '        family: "nv_inference_first_response_histogram_ms"\n      }\n'
            '      histogram_options: {\n        buckets: [ -1, 0.0, 1, 2.5 ]\n      }\n    }\n  ]\n}\n')
    base = f"--model-repository={mm} --model-control-mode=explicit --load-model={model}"
    _run(qa, d, f"{base} --metrics-config histogram_latencies=true --log-verbose=1", "model_metric_config_server.log",
         "histogram_metrics_test.py", ["TestHistogramMetrics.test_buckets_override"],
         env={"OVERRIDE_BUCKETS": "-1,0,1,2.5,+Inf"})
    _run(qa, d, f"{base} --metrics-config histogram_latencies=false --log-verbose=1",
         "model_metric_config_off_server.log", config_test, ["MetricsConfigTest.test_inf_histograms_missing"],
         "model_metrics_histogram_off")


# ====================================================================== L0_response_cache
ONLY_LOCAL = ("tritond has only the local cache; it refuses --cache-config redis,... "
              "(\"cache 'redis' is not supported\")")
ENSEMBLE_CACHE_TESTS = ("test_ensemble_top_level_response_cache", "test_ensemble_all_models_cache_enabled",
                        "test_ensemble_composing_model_cache_enabled", "test_ensemble_cache_insertion_failure")


PYTHON_ONLY = "decoupled models are supported for the python backend only"


def _refused_decoupled(qa, d: Path, repo: Path, model: str, case: str) -> None:
    """check_server_failure_decoupled_model: the load fails, naming the cache and decoupled."""
    server = qa.start(d, f"--model-repository={repo} --cache-config local,size=10480 --model-control-mode=explicit "
                         f"--load-model={model}", f"{case}.server.log", timeout=60)
    text = (qa.results / f"{qa.suite}.{case}.server.log").read_text(errors="replace").lower()
    if server is not None:
        server.stop()
        qa.check(case, False, "server started, expected it to refuse")
        return
    if PYTHON_ONLY in text:
        qa.record("test.sh", case, "skip", "tritond refuses its decoupled onnxruntime model ('decoupled models are "
                                           "supported for the python backend only') before the ensemble is checked")
        return
    ok = any("response cache does not currently support" in ln and "decoupled" in ln for ln in text.splitlines())
    qa.check(case, ok, f"no line with 'response cache does not currently support' and 'decoupled': {text[-600:]}")


def _starts(qa, d: Path, args: str, case: str) -> None:
    server = qa.start(d, args, f"{case}.server.log")
    qa.check(case, server is not None, f"server did not start: {qa.last_start_error}")
    if server is not None:
        server.stop()


def _refused_with(qa, d: Path, args: str, case: str, expect: str) -> None:
    """check_server_expected_failure (its grep is case-insensitive)."""
    server = qa.start(d, args, f"{case}.server.log", timeout=60)
    text = (qa.results / f"{qa.suite}.{case}.server.log").read_text(errors="replace")
    if server is not None:
        server.stop()
        qa.check(case, False, "server started, expected it to refuse")
    else:
        qa.check(case, expect.lower() in text.lower(), f"log lacks '{expect}': {text[-600:]}")


def l0_response_cache(qa) -> None:
    d = qa.qa / "L0_response_cache"
    print("  (not run: response_cache_test, the core's C++ unit test with a Redis server; the memory-growth "
          "check runs tritonserver under valgrind massif with perf_analyzer)", flush=True)
    models = d / "models"
    ensemble, composing = "simple_onnx_float32_float32_float32", "onnx_float32_float32_float32"
    repos = {name: _fresh(models / name) for name in
             ("ensemble_models", "ensemble_cache_decoupled", "ensemble_cache_composing_decoupled")}
    for repo in repos.values():
        _copytree(qa.data / "qa_ensemble_model_repository" / "qa_model_repository" / ensemble, repo / ensemble)
        _copytree(qa.data / "qa_model_repository" / composing, repo / composing)
    for name in ("decoupled_cache", "identity_cache"):
        (models / name / "1").mkdir(parents=True, exist_ok=True)
    _append(repos["ensemble_cache_decoupled"] / ensemble / "config.pbtxt",
            "response_cache { enable: True }\nmodel_transaction_policy { decoupled: True }")
    _append(repos["ensemble_cache_composing_decoupled"] / ensemble / "config.pbtxt", "response_cache { enable: True }")
    _append(repos["ensemble_cache_composing_decoupled"] / composing / "config.pbtxt",
            "model_transaction_policy { decoupled: True }")

    _refused_decoupled(qa, d, models, "decoupled_cache", "decoupled model with the cache refused")
    extra = "--model-control-mode=explicit --load-model=identity_cache"
    _starts(qa, d, f"--model-repository={models} --response-cache-byte-size=8192 {extra}",
            "--response-cache-byte-size starts")
    _starts(qa, d, f"--model-repository={models} --cache-config=local,size=8192 {extra}", "--cache-config local starts")
    _refused_with(qa, d, f"--model-repository={models} --cache-config=local,size=8192 --cache-config=redis,key=value "
                         f"{extra}", "two caches refused", "multiple cache configurations")
    _refused_with(qa, d, f"--model-repository={models} --response-cache-byte-size=12345 "
                         "--cache-config=local,size=67890 "
                         f"{extra}", "both cache flags refused", "incompatible flags")
    _skip_all(qa, "test.sh", ["redis cache starts", "redis port nonexistent refused", "redis host nonexistent refused",
                              "redis without host refused", "redis password", "redis wrong password refused",
                              "redis without auth refused", "redis password from env",
                              "redis username and password from env", "redis wrong password from env refused"],
              ONLY_LOCAL)
    _refused_decoupled(qa, d, repos["ensemble_cache_decoupled"], ensemble, "decoupled ensemble with the cache refused")
    _refused_decoupled(qa, d, repos["ensemble_cache_composing_decoupled"], ensemble,
                       "ensemble with the cache over a decoupled model refused")
    for case in ENSEMBLE_CACHE_TESTS:
        size = 200 if case == "test_ensemble_cache_insertion_failure" else 10840
        log = f"{case}.server.log"
        server = qa.start(d, f"--model-repository={repos['ensemble_models']} --cache-config local,size={size} "
                             "--model-control-mode=explicit", log)
        qa.unittest(d, "ensemble_cache_test.py", [f"EnsembleCacheTest.{case}"], server=server)
        if server is not None:
            server.stop()
            if case == "test_ensemble_cache_insertion_failure":
                text = (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
                qa.check("'Failed to insert key' logged", "failed to insert key" in text.lower(),
                         "the server log lacks 'Failed to insert key'")


# ====================================================================== L0_response_statistics
SQUARE_DELAYS = ("stands in for nothing faithfully: its square_int32 models are the C++ `square` test backend with "
                 "CUSTOM_INFER_DELAY_NS, CUSTOM_OUTPUT_DELAY_NS, CUSTOM_FAIL_COUNT, CUSTOM_EMPTY_COUNT and "
                 "CUSTOM_CANCEL_DELAY_NS, which time each response's compute_infer and compute_output phases inside "
                 "the backend; a Python model cannot delay the output phase of a response it sends")


def l0_response_statistics(qa) -> None:
    d = qa.qa / "L0_response_statistics"
    _skip_all(qa, "response_statistics_test.py", _tests_of(d / "response_statistics_test.py"), SQUARE_DELAYS)


# ====================================================================== L0_iterative_sequence


def l0_iterative_sequence(qa) -> None:
    """Its model's C++ `iterative_sequence` backend is stood in for by a Python-based backend of that
    name (standins/iterative_sequence.py) in a backend directory of the suite's own."""
    d = qa.qa / "L0_iterative_sequence"
    backends = _fresh(d / "backends")
    (backends / "iterative_sequence").mkdir()
    shutil.copy(STANDIN / "iterative_sequence.py", backends / "iterative_sequence" / "model.py")
    # Dockerfile.QA makes version 1 (and puts the C++ backend's library in it)
    (d / "models" / "iterative_sequence" / "1").mkdir(exist_ok=True)
    s = qa.start(d, f"--model-repository={d / 'models'} --model-control-mode=EXPLICIT --backend-directory={backends}",
                 "inference_server.log")
    qa.unittest(d, "iterative_sequence_e2e.py", server=s)
    if s:
        s.stop()


# ====================================================================== L0_rate_limiter
STANDIN = Path(__file__).resolve().parent / "standins"
LIMITED = ('Resource count for "resource1" is limited to {} which will prevent scheduling of one or more model '
           'instances, the minimum required count is 4')


def _sequence_standin(models: Path) -> None:
    """custom_sequence_int32 with the C++ `sequence` backend's config, on the Python stand-in."""
    cfg = models / "custom_sequence_int32" / "config.pbtxt"
    _sed(cfg, r'backend:\s*"sequence"', 'backend: "python"')
    _sed(cfg, r"default_model_filename:.*\n", "")
    (cfg.parent / "1").mkdir(exist_ok=True)
    shutil.copy(STANDIN / "sequence_accumulator.py", cfg.parent / "1" / "model.py")


def _rate_models(qa, d: Path) -> Path:
    models = _fresh(d / "custom_models")
    for name in ("custom_zero_1_float32", "custom_sequence_int32"):
        _copytree(qa.qa / "custom_models" / name, models / name)
    _sequence_standin(models)
    print("  (stand-in: custom_sequence_int32 runs standins/sequence_accumulator.py, the C++ sequence backend's "
          "accumulator)", flush=True)
    (models / "custom_zero_1_float32" / "1").mkdir()
    _copytree(models / "custom_zero_1_float32", models / "custom_zero_1_float32_v2")
    delay = 'parameters [\n{ key: "execute_delay_ms"; value: { string_value: "100" }}\n]'
    v1 = models / "custom_zero_1_float32" / "config.pbtxt"
    _sed(v1, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(v1, r"max_batch_size:.*", "max_batch_size: 4")
    _append(v1, 'instance_group [{\nkind: KIND_GPU count: 1\nrate_limiter { resources [{name: "resource1" count: 4 }]}'
                "\n}]\n" + delay)
    v2 = models / "custom_zero_1_float32_v2" / "config.pbtxt"
    _sed(v2, "custom_zero_1_float32", "custom_zero_1_float32_v2")
    _sed(v2, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(v2, r"max_batch_size:.*", "max_batch_size: 4")
    _append(v2, 'instance_group [{\nkind: KIND_GPU count: 1\nrate_limiter { resources [{name: "resource1" count: 2 }, '
                '{name: "resource2" global: True count: 2 }] priority: 2}\n}]\n' + delay)
    from suites_models import _cpu_kind
    _cpu_kind(qa, v1)
    _cpu_kind(qa, v2)
    return models


def _rate_refused(qa, d: Path, args: str, log: str, expect: str) -> None:
    server = qa.start(d, args, log, timeout=60)
    if server is not None:
        server.stop()
        qa.check(f"refused: {expect}", False, "server started, expected it to refuse")
        return
    text = _log(qa, log)
    qa.check(f"refused: {expect} [{log}]", expect in text, f"log lacks the line: {text[-600:]}")


def l0_rate_limiter(qa) -> None:
    d = qa.qa / "L0_rate_limiter"
    models = _rate_models(qa, d)
    base = f"--rate-limit=execution_count --model-repository={models}"
    test = "rate_limiter_test.py"
    _rate_refused(qa, d, f"{base} --rate-limit-resource=resource1:1", "r1.server.log", LIMITED.format(1))
    _rate_refused(qa, d, f"{base} --rate-limit-resource=resource1:3 --rate-limit-resource=resource2:2",
                  "r3.server.log", LIMITED.format(3))
    _rate_refused(qa, d, f"{base} --rate-limit-resource=resource1:10:10 --rate-limit-resource=resource2:2",
                  "rdevice.server.log", LIMITED.format(0))
    v3 = models / "custom_zero_1_float32_v3"
    _copytree(models / "custom_zero_1_float32_v2", v3)
    _sed(v3 / "config.pbtxt", "custom_zero_1_float32_v2", "custom_zero_1_float32_v3")
    _sed(v3 / "config.pbtxt", "global: True", "global: False")
    _rate_refused(qa, d, base, "conflict.server.log",
                  'Resource "resource2" is present as both global and device-specific resource in the model '
                  "configuration.")
    shutil.rmtree(v3)
    cross = "RateLimiterTest.test_cross_model_prioritization_"
    _run(qa, d, f"{base} --rate-limit-resource=resource1:4 --rate-limit-resource=resource2:2", "limited.server.log",
         test, [cross + "limited_resource"], "resource1:4")
    _run(qa, d, base, "limited_default.server.log", test, [cross + "limited_resource"], "default")
    _run(qa, d, f"{base} --rate-limit-resource=resource1:6 --rate-limit-resource=resource2:2", "plenty.server.log",
         test, [cross + "plenty_resource"])
    shutil.rmtree(models / "custom_zero_1_float32_v2")
    v1 = models / "custom_zero_1_float32" / "config.pbtxt"
    _append(v1, 'instance_group [{\nkind: KIND_GPU count: 1\nrate_limiter { resources [{name: "resource1" count: 2 }, '
                '{name: "resource2" global: True count: 2 }] priority: 2}\n}]')
    from suites_models import _cpu_kind
    _cpu_kind(qa, v1)
    durations = {}
    for variant, extra in (("limited", ""), ("plenty", " --rate-limit-resource=resource1:6 "
                                                       "--rate-limit-resource=resource2:2")):
        start = time.monotonic()
        _run(qa, d, base + extra, f"single_{variant}.server.log", test, ["RateLimiterTest.test_single_model"], variant)
        durations[variant] = time.monotonic() - start
    qa.check("limited resources take longer than plenty", durations["plenty"] <= durations["limited"] + 1,
             f"limited {durations['limited']:.1f}s, plenty {durations['plenty']:.1f}s")
    _rate_refused(qa, d, f"{base} --rate-limit-resource=resource1:3 --rate-limit-resource=resource2:2",
                  "r3i.server.log", LIMITED.format(3))
    _sed(v1, r".*execute_delay_ms.*", '{ key: "execute_delay_ms"; value: { string_value: "1000" }}')
    _append(v1, "dynamic_batching { preferred_batch_size: [ 1, 2, 3, 4 ]\n max_queue_delay_microseconds: 5000000 }")
    _run(qa, d, base, "dynamic.server.log", test, ["RateLimiterTest.test_single_model_dynamic_batching"],
         env={"TRITONSERVER_DELAY_SCHEDULER": "8"})
    seq = models / "custom_sequence_int32" / "config.pbtxt"
    first = 'rate_limiter { resources [{name: "resource1" count: 4 }]}'
    _sed(seq, r"max_sequence_idle_microseconds:.*", "max_sequence_idle_microseconds: 1000000")
    _sed(seq, r"(?m)^max_batch_size:.*", "max_batch_size: 1")
    _sed(seq, "kind: KIND_GPU", f"kind: KIND_CPU\ncount: 1 \n{first}")
    _sed(seq, "kind: KIND_CPU", f"kind: KIND_CPU\ncount: 1 \n{first}", count=1)
    _append(seq, 'instance_group [{\nkind: KIND_CPU count: 1\nrate_limiter { resources [{name: "resource1" count: 2 }, '
                 '{name: "resource2" global: True count: 2 }] priority: 2}\n}]\n'
                 'instance_group [{\nkind: KIND_CPU count: 2\nrate_limiter { resources [{name: "resource1" count: 2 }, '
                 '{name: "resource2" global: True count: 2 }] priority: 3}\n}]')
    _run(qa, d, base, "sequence.server.log", test, ["RateLimiterTest.test_single_model_sequence_batching"])


# ====================================================================== L0_logging
LINE = re.compile(r"^[IWEV][0-9]{4}", re.M)
LOG_REGEX = (r"(?P<month>\d{2})(?P<day>\d{2}) (?P<timestamp>\d{2}:\d{2}:\d{2}\.\d{6}) (?P<pid>\d+) "
             r"(?P<file>[\w\.]+):(?P<line>\d+)] (?P<message>.*)")


def _http(method: str, path: str, body: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://localhost:8000{path}", data=None if body is None else body.encode(),
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _settings_are(qa, case: str, file: str, info: str, warning: str, error: str, verbose: str, fmt: str) -> None:
    """verify_correct_settings: GET /v2/logging, each setting as test.sh greps it."""
    _, body = _http("GET", "/v2/logging")
    want = [f'"log_file":"{file}"', f'"log_info":{info}', f'"log_warning":{warning}', f'"log_error":{error}',
            f'"log_verbose_level":{verbose}', f'"log_format":"{fmt}"']
    missing = [w for w in want if body.count(w) != 1]
    qa.check(f"settings {case}", not missing, f"{missing} not once in {body}")


def _simple_clients(qa, case: str) -> None:
    """What test.sh's simple_http_infer_client and simple_grpc_infer_client (C++ examples) do:
    one inference of `simple` over each protocol, its sum and difference checked."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    for proto, mod, url in (("http", httpclient, "localhost:8000"), ("grpc", grpcclient, "localhost:8001")):
        try:
            inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = mod.InferenceServerClient(url).infer("simple", inputs)
            ok = (result.as_numpy("OUTPUT0") == a + b).all() and (result.as_numpy("OUTPUT1") == a - b).all()
            qa.check(f"simple {proto} client {case}", bool(ok), "wrong sum or difference")
        except Exception as e:  # noqa: BLE001 - the client's failure is the case's result
            qa.check(f"simple {proto} client {case}", False, f"{type(e).__name__}: {e}")


def _at_least(qa, case: str, n: int, minimum: int) -> None:
    """test.sh's floor on how many lines Triton writes: none is a failure; some, fewer than
    Triton's own startup tables and dumps make, is recorded skipped with the count."""
    if n == 0 or n >= minimum:
        qa.check(case, n > 0, "no lines")
    else:
        qa.record("test.sh", case, "skip", f"{n} lines: the floor counts Triton's own lines (its startup tables, "
                                           f"backend and model-config dumps), which tritond does not write")


def _count(path: Path, pattern: re.Pattern | str) -> int:
    text = path.read_text(errors="replace") if path.exists() else ""
    return len(pattern.findall(text)) if isinstance(pattern, re.Pattern) else text.count(pattern)


def _stop_left(pids: Path) -> None:
    """The servers a test left running (log_format_test.py raises before its kill when the log
    file is late, as it can be on a loaded host): stopped, so the next start finds its ports."""
    for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(600):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)        # its own processes follow it (parent-death signal)


def _start_split(qa, d: Path, args: str):
    """run_server with SERVER_ERROR_LOG: stdout and stderr in two files; the server, or None
    once it has exited (it should: its only model cannot load)."""
    out = open(qa.results / f"{qa.suite}.invalid.server.log", "w")
    err = open(qa.results / f"{qa.suite}.invalid.server_error.log", "w")
    print(f"  === {qa.suite}: tritond {args}  [stderr apart]", flush=True)
    proc = subprocess.Popen(qa.tritond + args.split(), cwd=d, stdout=out, stderr=err, start_new_session=True)
    out.close()
    err.close()
    try:
        proc.wait(qa.server_timeout)
        return None
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return proc


def l0_logging(qa) -> None:
    d = qa.qa / "L0_logging"
    print("  (deviation: test.sh's C++ simple_http_infer_client and simple_grpc_infer_client are one inference of "
          "'simple' per protocol through tritonclient; not run: logging_test, the C++ log-callback unit test)",
          flush=True)
    models = _fresh(d / "log_models")
    _copytree(qa.data / "qa_model_repository" / "onnx_int32_int32_int32", models / "simple")
    for v in ("2", "3"):
        shutil.rmtree(models / "simple" / v)
    _sed(models / "simple" / "config.pbtxt", r"(?m)^name:.*", 'name: "simple"')
    logfile = d / "log_file.log"
    repo = f"--model-repository={models}"

    def server(args: str, log: str):
        return qa.start(d, args, log)

    def stop(s) -> None:
        if s is not None:
            s.stop()

    def console(log: str) -> Path:
        return qa.results / f"{qa.suite}.{log}"

    # default settings, console log
    s = server(repo, "default.server.log")
    if s is not None:
        _settings_are(qa, "default", "", "true", "true", "true", "0", "default")
        _simple_clients(qa, "default")
        stop(s)
        n = len(console("default.server.log").read_text(errors="replace").splitlines())
        _at_least(qa, "console log has more than 30 lines", n, 31)
    else:
        qa.check("default server starts", False, qa.last_start_error)

    # --log-file
    logfile.unlink(missing_ok=True)
    s = server(f"--log-file=log_file.log {repo}", "log_file.server.log")
    if s is not None:
        _settings_are(qa, "log_file", "log_file.log", "true", "true", "true", "0", "default")
        _simple_clients(qa, "log_file")
        _at_least(qa, "log file has at least 19 lines", _count(logfile, LINE), 19)
        n = _count(console("log_file.server.log"), LINE)
        qa.check("no log lines on the console with --log-file", n == 0, f"{n} lines")
        stop(s)
    logfile.unlink(missing_ok=True)

    # --log-file --log-verbose=1, and log_file cannot be set
    s = server(f"--log-file=log_file.log --log-verbose=1 {repo}", "log_verbose.server.log")
    if s is not None:
        _, body = _http("POST", "/v2/logging", '{"log_file":"other_log.log"}')
        qa.check("log_file update refused", body.count('"error":"log file location can not be updated through '
                                                       'network protocol"') == 1, body)
        _settings_are(qa, "log_verbose", "log_file.log", "true", "true", "true", "1", "default")
        _simple_clients(qa, "log_verbose")
        _at_least(qa, "verbose log file has at least 75 lines", _count(logfile, LINE), 75)
        n = _count(console("log_verbose.server.log"), LINE)
        qa.check("no log lines on the console with --log-file [verbose]", n == 0, f"{n} lines")
        stop(s)
    logfile.unlink(missing_ok=True)

    # --log-info=false, then on again
    s = server(f"--log-file=log_file.log --log-info=false --log-verbose=1 {repo}", "log_info.server.log")
    if s is not None:
        _settings_are(qa, "log_info off", "log_file.log", "false", "true", "true", "1", "default")
        _simple_clients(qa, "log_info off")
        qa.check("no 'Started HTTPService at' with --log-info=false",
                 _count(logfile, "Started HTTPService at") == 0, "the log file has it")
        _http("POST", "/v2/logging", '{"log_info":true}')
        _settings_are(qa, "log_info on", "log_file.log", "true", "true", "true", "1", "default")
        _simple_clients(qa, "log_info on")
        stop(s)
        n = _count(logfile, "Waiting for in-flight requests to complete")
        qa.check("'Waiting for in-flight requests to complete' logged once at exit", n == 1, f"{n} times")

    for flag, case, want in (("--log-warning=false", "log_warning off", ("true", "false", "true")),
                             ("--log-error=false", "log_error off", ("true", "true", "false"))):
        s = server(f"{flag} {repo}", f"{case.replace(' ', '_')}.server.log")
        if s is not None:
            _settings_are(qa, case, "", *want, "0", "default")
            _simple_clients(qa, case)
            stop(s)

    # verbose lines follow the verbose level
    logfile.unlink(missing_ok=True)
    s = server(f"--log-file=log_file.log --log-verbose=1 {repo}", "log_verbose_level.server.log")
    if s is not None:
        _http("GET", "/v2/logging")
        _settings_are(qa, "verbose 1", "log_file.log", "true", "true", "true", "1", "default")
        _simple_clients(qa, "verbose 1")
        n = _count(logfile, "/v2/logging")
        qa.check("two verbose lines name /v2/logging", n == 2, f"{n} lines")
        _http("POST", "/v2/logging", '{"log_verbose_level":0}')
        _settings_are(qa, "verbose 0", "log_file.log", "true", "true", "true", "0", "default")
        _http("GET", "/v2/logging")
        n = _count(logfile, "/v2/logging")
        qa.check("no more verbose lines at level 0", n <= 3, f"{n} lines")
        stop(s)

    # --log-format=ISO8601, then default through the API
    logfile.unlink(missing_ok=True)
    s = server(f"--log-file=log_file.log --log-verbose=1 --log-format=ISO8601 {repo}", "log_format.server.log")
    if s is not None:
        today = "I" + time.strftime("%m%d")
        _settings_are(qa, "ISO8601", "log_file.log", "true", "true", "true", "1", "ISO8601")
        _simple_clients(qa, "ISO8601")
        lines = logfile.read_text(errors="replace").splitlines() if logfile.exists() else [""]
        qa.check("ISO8601 lines", (lines[0].split() or [""])[0] != today, lines[0])
        _http("POST", "/v2/logging", '{"log_format":"default"}')
        _settings_are(qa, "default again", "log_file.log", "true", "true", "true", "1", "default")
        lines = logfile.read_text(errors="replace").splitlines() or [""]
        qa.check("default lines after the update", (lines[-1].split() or [""])[0] == today, lines[-1])
        stop(s)

    # settings of the wrong type are refused
    s = server(f"--log-warn=false {repo}", "bad_settings.server.log")
    if s is not None:
        for param in ("log_info", "log_warning", "log_error"):
            for value in ("1", "False", '"false"'):
                code, body = _http("POST", "/v2/logging", f'{{"{param}":{value}}}')
                qa.check(f"{param}: {value} refused", code != 200, f"{code} {body}")
            code, body = _http("POST", "/v2/logging", f'{{"{param}":true}}')
            qa.check(f"{param}: true accepted", code == 200, f"{code} {body}")
        for value, ok in (("-1", False), ('"1"', False), ("0", True)):
            code, body = _http("POST", "/v2/logging", f'{{"log_verbose_level":{value}}}')
            qa.check(f"log_verbose_level: {value} {'accepted' if ok else 'refused'}", (code == 200) == ok,
                     f"{code} {body}")
        stop(s)

    _run(qa, d, repo, "unittest.server.log", "logging_endpoint_test.py", [])

    # log_format_test.py starts `tritonserver` itself: here that name runs tritond
    shim = _fresh(qa.results / "bin")
    (shim / "tritonserver").write_text(f'#!/bin/sh\necho $$ >> {shim}/pids\nexec {qa.tritond[0]} "$@"\n')
    (shim / "tritonserver").chmod(0o755)
    from suites_python_backend import _pytest
    _pytest(qa, d, "log_format_test.py", server=True, env={"PATH": f"{shim}:{os.environ['PATH']}"})
    _stop_left(shim / "pids")

    # a model that fails to load: INFO lines on stdout, warnings and errors on stderr
    invalid = _fresh(d / "log_models_invalid")
    _copytree(models / "simple", invalid / "simple")
    (invalid / "simple" / "1").rename(invalid / "simple" / "01")
    s = _start_split(qa, d, f"--log-verbose=1 --model-repository={invalid}")
    out, err = _log(qa, "invalid.server.log"), _log(qa, "invalid.server_error.log")
    qa.check("a server whose model cannot load exits", s is None, "it was still running")
    qa.check("INFO lines on stdout", bool(re.search("(?m)I" + LOG_REGEX, out)), out[-400:])
    qa.check("no WARNING or ERROR lines on stdout", not re.search("(?m)(W|E)" + LOG_REGEX, out), out[-400:])
    qa.check("no INFO lines on stderr", not re.search("(?m)I" + LOG_REGEX, err), err[-400:])
    qa.check("WARNING lines on stderr", bool(re.search("(?m)W" + LOG_REGEX, err)), err[-400:])
    qa.check("ERROR lines on stderr", bool(re.search("(?m)E" + LOG_REGEX, err)), err[-400:])


# ====================================================================== L0_cmdline_trace
def _trace_summary(qa, d: Path, trace: str) -> str:
    """qa/common/trace_summary.py's report of a trace file (empty when it is missing)."""
    path = d / trace
    if not path.exists():
        return ""
    out = subprocess.run([sys.executable, str(qa.qa / "common" / "trace_summary.py"), "-t", str(path)], cwd=d,
                         capture_output=True, text=True, timeout=300)
    return out.stdout


def _trace_clients(qa, d: Path, case: str, rounds: int = 10, protocols: tuple[str, ...] = ("grpc", "http")) -> None:
    """test.sh's loop: trace_client.py over gRPC then HTTP, `rounds` times."""
    failed = []
    urls = {"grpc": "localhost:8001", "http": "localhost:8000"}
    for _ in range(rounds):
        for proto, url in ((p, urls[p]) for p in protocols):
            r = subprocess.run([sys.executable, "trace_client.py", "-i", proto, "-u", url], cwd=d,
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                failed.append(f"{proto}: {(r.stdout + r.stderr).strip()[-300:]}")
    qa.check(f"trace clients [{case}]", not failed, "; ".join(failed[:2]))


def _traced(qa, d: Path, args: str, case: str, trace: str, counts: dict[str, tuple[int, int]],
            model: str = "simple", rounds: int = 10, files: tuple[str, ...] = (),
            protocols: tuple[str, ...] = ("grpc", "http")) -> str:
    """One server: the clients, then the summary's COMPUTE_INPUT_END and model lines counted."""
    for f in (trace, *files):
        (d / f).unlink(missing_ok=True)
    server = qa.start(d, args, f"{case}.server.log")
    if server is None:
        qa.check(f"server starts [{case}]", False, qa.last_start_error)
        return ""
    _trace_clients(qa, d, case, rounds, protocols)
    server.stop()
    text = ""
    for f, (computes, models) in counts.items():
        summary = _trace_summary(qa, d, f)
        text += summary
        n = summary.count("COMPUTE_INPUT_END")
        qa.check(f"{computes} traced executions in {f}", n == computes, f"{n} found")
        m = len(re.findall(rf"(?m)^{re.escape(model)}", summary))
        qa.check(f"{models} '{model}' lines in {f}'s summary", m == models, f"{m} found")
    return text


def l0_cmdline_trace(qa) -> None:
    d = qa.qa / "L0_cmdline_trace"
    base = "onnx_int32_int32_int32"
    models = _fresh(d / "trace_models")
    _copytree(qa.data / "qa_model_repository" / base, models / "simple")
    for v in ("2", "3"):
        shutil.rmtree(models / "simple" / v)
    _sed(models / "simple" / "config.pbtxt", r"(?m)^name:.*", 'name: "simple"')
    repo = f"--model-repository={models}"

    (d / "trace_off.log").unlink(missing_ok=True)
    server = qa.start(d, f"--trace-file=trace_off.log --trace-level=OFF --trace-rate=1 {repo}", "off.server.log")
    if server is not None:
        _trace_clients(qa, d, "off")
        server.stop()
        qa.check("no trace file with --trace-level=OFF", not (d / "trace_off.log").exists(), "trace_off.log written")
    else:
        qa.check("server starts [off]", False, qa.last_start_error)
    _traced(qa, d, f"--trace-file=trace_min.log --trace-level=MIN --trace-rate=1 {repo}", "min", "trace_min.log",
            {"trace_min.log": (20, 20)})
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_max.log --trace-level=MAX --trace-rate=9 {repo}",
            "max", "trace_max.log", {"trace_max.log": (2, 2)})
    _traced(qa, d, f"--trace-file=trace_1.log --trace-level=TIMESTAMPS --trace-rate=1 {repo}", "rate_1",
            "trace_1.log", {"trace_1.log": (20, 20)})
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_6.log --trace-level=TIMESTAMPS --trace-rate=6 {repo}",
            "rate_6", "trace_6.log", {"trace_6.log": (3, 3)})
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_frequency.log --trace-level=TIMESTAMPS --trace-rate=6 "
                   f"--trace-log-frequency=2 {repo}", "frequency", "trace_frequency.log",
            {"trace_frequency.log.0": (2, 2), "trace_frequency.log.1": (1, 1)},
            files=("trace_frequency.log.0", "trace_frequency.log.1"))
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_9.log --trace-level=TIMESTAMPS --trace-rate=9 {repo}",
            "rate_9", "trace_9.log", {"trace_9.log": (2, 2)})

    # an ensemble of ensembles: one trace per model request, parents named
    ens = qa.data / "qa_ensemble_model_repository" / "qa_model_repository"
    models = _fresh(d / "trace_models")
    _copytree(qa.data / "qa_model_repository" / base, models / base)
    for v in ("2", "3"):
        shutil.rmtree(models / base / v)
    for name, src in ((f"fan_{base}", f"fan_{base}"), ("simple", f"fan_{base}")):
        (models / name / "1").mkdir(parents=True)
        shutil.copy(ens / src / "config.pbtxt", models / name)
        _sed(models / name / "config.pbtxt", r"label_filename:.*", "")
    _sed(models / "simple" / "config.pbtxt", r"(?m)^name:.*", 'name: "simple"')
    _sed(models / "simple" / "config.pbtxt", rf"(?m)^(.*?){base}", rf"\g<1>fan_{base}")     # sed: once a line
    _copytree(ens / "nop_TYPE_INT32_-1", models / "nop_TYPE_INT32_-1")
    (models / "nop_TYPE_INT32_-1" / "1").mkdir(exist_ok=True)
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_ensemble.log --trace-level=TIMESTAMPS --trace-rate=1 "
                   f"{repo}", "ensemble", "trace_ensemble.log", {"trace_ensemble.log": (7, 1)}, rounds=1,
            protocols=("http",))
    text = (d / "trace_ensemble.log").read_text() if (d / "trace_ensemble.log").exists() else ""
    nop, fan = "nop_TYPE_INT32_-1", f"fan_{base}"
    expect = [(1, "simple", None), (2, nop, 1), (3, fan, 1), (4, nop, 3), (5, base, 3), (6, nop, 3), (7, nop, 3),
              (8, nop, 1), (9, nop, 1)]
    for i, model, parent in expect:
        line = (f'{{"id":{i},"model_name":"{model}","model_version":1,"request_id":"1"'
                + (f',"parent_id":{parent}' if parent else "") + "}")
        qa.check(f"trace {line}", text.count(line) == 1, f"{text.count(line)} found")

    # the same with --trace-level=TENSORS too: each trace's inputs and each model's outputs
    _traced(qa, d, f"--http-thread-count=1 --trace-file=trace_ensemble_tensor.log --trace-level=TIMESTAMPS "
                   f"--trace-level=TENSORS --trace-rate=1 {repo}", "ensemble_tensor", "trace_ensemble_tensor.log",
            {"trace_ensemble_tensor.log": (7, 1)}, rounds=1, protocols=("http",))
    text = (d / "trace_ensemble_tensor.log").read_text() if (d / "trace_ensemble_tensor.log").exists() else ""
    for i, model, parent in expect:
        line = (f'{{"id":{i},"model_name":"{model}","model_version":1,"request_id":"1"'
                + (f',"parent_id":{parent}' if parent else "") + "}")
        qa.check(f"tensor trace {line}", text.count(line) == 1, f"{text.count(line)} found")
    for activity, count in (("TENSOR_QUEUE_INPUT", 18), ("TENSOR_BACKEND_OUTPUT", 14)):
        qa.check(f"{count} {activity}s", text.count(activity) == count, f"{text.count(activity)} found")
    seq = ",".join(map(str, range(16)))
    for activity, name, data in (("TENSOR_QUEUE_INPUT", "INPUT0", seq), ("TENSOR_QUEUE_INPUT", "INPUT1", ",".join(["1"] * 16)),
                                 ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", ",".join(map(str, range(1, 17)))),
                                 ("TENSOR_BACKEND_OUTPUT", "OUTPUT1", ",".join(map(str, range(-1, 15))))):
        line = (f'{{"id":1,"activity":"{activity}","tensor":{{"name":"{name}","data":"{data}","shape":"1,16",'
                f'"dtype":"INT32"}}}}')
        qa.check(f"tensor trace {line}", text.count(line) == 1, f"{text.count(line)} found")

    # the deprecated flags, and bad batch span processor settings
    server = qa.start(d, f"--trace-file=/tmp/trace.json --trace-rate=100 --trace-level=TIMESTAMPS "
                         f"--trace-log-frequency=50 --trace-count=100 {repo}", "deprecated.server.log")
    if server is not None:
        server.stop()
    text = _log(qa, "deprecated.server.log")
    for flag in ("--trace-file", "--trace-rate", "--trace-level", "--trace-log-frequency", "--trace-count"):
        n = text.count(f"Warning: '{flag}' has been deprecated")
        qa.check(f"'{flag}' deprecation warned once", n == 1, f"{n} times")
    for env in ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        _refused_env(qa, d, repo, env)
    for setting in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
        qa.refused(d, f"{repo} --trace-config mode=opentelemetry --trace-config opentelemetry,{setting}=bad_value",
                   f"{setting}.server.log", f'Bad option: "--trace-config opentelemetry,{setting}"',
                   f"refused: opentelemetry,{setting}=bad_value")


def _refused_env(qa, d: Path, repo: str, env: str) -> None:
    server = qa.start(d, f"--trace-config mode=opentelemetry {repo}", f"{env}.server.log", env={env: "bad_value"},
                      timeout=30)
    if server is not None:
        server.stop()
    text = _log(qa, f"{env}.server.log")
    qa.check(f"refused: {env}=bad_value", server is None and text.count(f'Bad option: "{env}"') == 1,
             text[-400:])
