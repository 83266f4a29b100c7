"""L0_simple_ensemble: ensembles over the example `simple` model and python models, the
per-step queue limits, a parallel step whose enqueue fails, max_inflight_requests back-pressure
and its refused values, each as its test.sh sets them up."""
from __future__ import annotations

import shutil
from pathlib import Path

from suites_http import _append, _copytree, _fresh, _sed

CONSUMER = """import time
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out_tensor = pb_utils.Tensor("OUTPUT0", in_tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse([out_tensor]))
            time.sleep({delay})
        return responses
"""
CONSUMER_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 2
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
dynamic_batching {{ preferred_batch_size: [ 2 ] }}
"""
BACKPRESSURE_ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 2
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
ensemble_scheduling {{
  {limit}
  step [
    {{ model_name: "decoupled_producer" model_version: -1
      input_map {{ key: "IN", value: "IN" }} output_map {{ key: "OUT", value: "intermediate_1" }} }},
    {{ model_name: "consumer_high_delay" model_version: -1
      input_map {{ key: "INPUT0", value: "intermediate_1" }}
      output_map {{ key: "OUTPUT0", value: "intermediate_2" }} }},
    {{ model_name: "consumer_low_delay" model_version: -1
      input_map {{ key: "INPUT0", value: "intermediate_2" }} output_map {{ key: "OUTPUT0", value: "OUT" }} }}
  ]
}}
"""
PARALLEL_ENSEMBLE = """name: "ensemble_parallel_step_failed_enqueue"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "decoupled_producer_parallel_queue" model_version: -1
      input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "intermediate" } },
    { model_name: "slow_consumer_queue_limited" model_version: -1
      input_map { key: "INPUT0" value: "intermediate" } output_map { key: "OUTPUT0" value: "slow_out" } },
    { model_name: "fast_consumer" model_version: -1
      input_map { key: "INPUT0" value: "intermediate" } output_map { key: "OUTPUT0" value: "fast_out" } },
    { model_name: "join_add_sub" model_version: -1
      input_map { key: "INPUT0" value: "slow_out" } input_map { key: "INPUT1" value: "fast_out" }
      output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""
QUEUE_LIMIT = ("dynamic_batching {\n  preferred_batch_size: [ 1 ]\n  default_queue_policy {\n"
               "    max_queue_size: %d\n  }\n}")


def _python(qa, dest: Path, source: Path, name: str | None = None, batch: str | None = None) -> Path:
    """A python model copied from `source` (a model dir holding 1/model.py or model.py), renamed."""
    (dest / "1").mkdir(parents=True, exist_ok=True)
    model_py = source / "1" / "model.py" if (source / "1" / "model.py").exists() else source / "model.py"
    shutil.copy(model_py, dest / "1" / "model.py")
    shutil.copy(source / "config.pbtxt", dest / "config.pbtxt")
    cfg = dest / "config.pbtxt"
    if name:
        _sed(cfg, f'name: "{source.name}"', f'name: "{name}"')
    if batch:
        _sed(cfg, "max_batch_size: 64", f"max_batch_size: {batch}")
    return dest


def _run(qa, d: Path, repo: Path, log: str, names: list[str], env: dict[str, str] | None = None,
         extra: str = "") -> None:
    s = qa.start(d, f"--model-repository={repo}{extra}", log)
    server_env = dict(env or {})
    if s is not None:
        server_env["SERVER_LOG"] = str(s.log)
    qa.unittest(d, names[0], names[1:], server=s, env=server_env)
    if s:
        s.stop()


def l0_simple_ensemble(qa) -> None:
    d = qa.qa / "L0_simple_ensemble"
    models, bp = d / "models", d / "backpressure_test_models"
    for version in ("1", "2"):      # Dockerfile.QA puts the example model in both versions
        (models / "simple" / version).mkdir(parents=True, exist_ok=True)
        shutil.copy(qa.examples / "simple" / "1" / "model.onnx", models / "simple" / version)
    for m in ("ensemble_add_sub_int32_int32_int32", "ensemble_partial_add_sub"):
        (models / m / "1").mkdir(parents=True, exist_ok=True)
    for test in ("test_ensemble_add_sub", "test_ensemble_sequence_flags", "test_ensemble_add_sub_one_output"):
        _run(qa, d, models, f"{test}.server.log", ["ensemble_test.py", f"EnsembleTest.{test}"])
    _run(qa, d, models, "test_ensemble_partial_add_sub.server.log",
         ["ensemble_test.py", "EnsembleTest.test_ensemble_partial_add_sub"], extra=" --log-verbose=1")

    ground_truth = qa.qa / "python_models" / "ground_truth"
    producer = bp / "decoupled_producer"
    mq = _fresh(d / "max_queue_size_test_models")
    for ens, renames in (("ensemble_step1_enabled_max_queue_size",
                          ('"decoupled_producer"', '"decoupled_producer_enabled_max_queue_size"')),
                         ("ensemble_step2_enabled_max_queue_size",
                          ('"slow_consumer"', '"slow_consumer_enabled_max_queue_size"'))):
        (mq / ens / "1").mkdir(parents=True)
        shutil.copy(bp / "ensemble_disabled_max_inflight_requests" / "config.pbtxt", mq / ens)
        _sed(mq / ens / "config.pbtxt", renames[0], renames[1])
    _python(qa, mq / "slow_consumer", ground_truth, "slow_consumer", "1")
    _python(qa, mq / "decoupled_producer_enabled_max_queue_size", producer, "decoupled_producer_enabled_max_queue_size")
    _append(mq / "decoupled_producer_enabled_max_queue_size" / "config.pbtxt", QUEUE_LIMIT % 4)
    _python(qa, mq / "decoupled_producer", producer)
    _python(qa, mq / "slow_consumer_enabled_max_queue_size", ground_truth, "slow_consumer_enabled_max_queue_size", "1")
    _append(mq / "slow_consumer_enabled_max_queue_size" / "config.pbtxt", QUEUE_LIMIT % 4)
    _run(qa, d, mq, "ensemble_step_max_queue_size_test.server.log",
         ["ensemble_backpressure_test.py", "EnsembleStepMaxQueueSizeTest"])

    pf = _fresh(d / "parallel_failed_enqueue_test_models")
    _python(qa, pf / "decoupled_producer_parallel_queue", producer, "decoupled_producer_parallel_queue")
    _sed(pf / "decoupled_producer_parallel_queue" / "1" / "model.py", "0.5", "2.0")
    _python(qa, pf / "slow_consumer_queue_limited", ground_truth, "slow_consumer_queue_limited", "1")
    _append(pf / "slow_consumer_queue_limited" / "config.pbtxt", QUEUE_LIMIT % 1)
    _python(qa, pf / "fast_consumer", ground_truth, "fast_consumer", "1")
    _sed(pf / "fast_consumer" / "1" / "model.py", r"time\.sleep\(delay\)", "time.sleep(0)")
    _python(qa, pf / "join_add_sub", qa.qa / "python_models" / "join_add_sub")
    (pf / "ensemble_parallel_step_failed_enqueue" / "1").mkdir(parents=True)
    (pf / "ensemble_parallel_step_failed_enqueue" / "config.pbtxt").write_text(PARALLEL_ENSEMBLE)
    s = qa.start(d, f"--model-repository={pf}", "ensemble_parallel_failed_enqueue_test.server.log")
    qa.unittest(d, "ensemble_backpressure_test.py",
                ["EnsembleParallelFailedEnqueueTest.test_parallel_step_failed_enqueue"], server=s,
                env={"PARALLEL_FAILED_ENQUEUE_LOOPS": "1"})
    if s:
        qa.check("parallel failed enqueue: server still live", s.proc.poll() is None, s.text()[-400:])
        s.stop()

    eb = _fresh(d / "ensemble_backpressure_test_models")
    _python(qa, eb / "decoupled_producer", producer)
    _sed(eb / "decoupled_producer" / "config.pbtxt", "max_batch_size: 1", "max_batch_size: 2")
    for name, delay in (("consumer_high_delay", "0.5"), ("consumer_low_delay", "0.1")):
        (eb / name / "1").mkdir(parents=True)
        (eb / name / "1" / "model.py").write_text(CONSUMER.format(delay=delay))
        (eb / name / "config.pbtxt").write_text(CONSUMER_CONFIG.format(name=name))
    for name, limit in (("ensemble_disabled", ""), ("ensemble_limit_1", "max_inflight_requests: 1"),
                        ("ensemble_limit_4", "max_inflight_requests: 4")):
        (eb / name / "1").mkdir(parents=True)
        (eb / name / "config.pbtxt").write_text(BACKPRESSURE_ENSEMBLE.format(name=name, limit=limit))
    s = qa.start(d, f"--model-repository={eb}", "ensemble_backpressure_test.server.log")
    lines = [f"Ensemble model 'ensemble_limit_{n}' configured with max_inflight_requests: {n}" for n in (1, 4)]
    for line in lines:
        qa.check(f"log: {line}", s is not None and line in s.text(), qa.current.text()[-400:])
    qa.unittest(d, "ensemble_backpressure_test.py", ["EnsembleBackpressureTest"], server=s)
    if s:
        s.stop()

    bad = _fresh(d / "invalid_param_test_models")
    _copytree(mq / "decoupled_producer", bad / "decoupled_producer")
    _copytree(mq / "slow_consumer", bad / "slow_consumer")
    for name, value in (("ensemble_invalid_negative_limit", "-5"), ("ensemble_invalid_string_limit", '"invalid_value"'),
                        ("ensemble_invalid_large_value_limit", "12345678901")):
        (bad / name / "1").mkdir(parents=True)
        shutil.copy(bp / "ensemble_disabled_max_inflight_requests" / "config.pbtxt", bad / name)
        _sed(bad / name / "config.pbtxt", r"ensemble_scheduling \{",
             f"ensemble_scheduling {{\n  max_inflight_requests: {value}")
    s = qa.start(d, f"--model-repository={bad}", "invalid_max_inflight_requests.server.log", timeout=60)
    text = (qa.results / f"{qa.suite}.invalid_max_inflight_requests.server.log").read_text(errors="replace")
    if s:
        s.stop()
    qa.check("invalid max_inflight_requests: server refused", s is None, "server started")
    for expect in ("Expected integer, got: -", 'Expected integer, got: "invalid_value"',
                   "Integer out of range (12345678901)"):
        qa.check(f"invalid max_inflight_requests: log has {expect!r}", expect in text, text[-600:])
