"""Streaming, cancellation and timeout suites: L0_decoupled, L0_request_cancellation,
L0_grpc_state_cleanup, L0_client_timeout.

Stand-ins for Triton's C++ test backends, each with the C++ model's config but `backend: "python"`:
`repeat_int32` and `square_int32` are the python_backend repository's examples/decoupled
repeat_model.py and square_model.py (as L0_decoupled's python trial uses them), so these suites
need `QA_PYTHON_BACKEND`. The identity models use the identity backend built into tritond.

What test.sh greps in Triton's log are Triton internals no client observes, so they are not
checked: the gRPC frontend's state objects ("StateNew"/"StateRelease"), the core's
"Cancellation notification received for" line, and the TRITONSERVER_DELAY_GRPC_* /
TRITONSERVER_DELAY_RESPONSE_* hooks that stall Triton's gRPC state machine at named steps.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from suites_http import _append, _copytree, _fresh, _note, _sed
from suites_python_backend import _python_backend

# the C++ test backends' configs (triton-inference-server/server src/test/models), backend aside
_PB_STANDINS = {"repeat_int32": ("repeat_model.py", "repeat_config.pbtxt"),
                "square_int32": ("square_model.py", "square_config.pbtxt")}


def _standin(qa, models: Path, name: str) -> bool:
    """models/<name>: the python_backend example that stands in for Triton's C++ test backend."""
    pb = _python_backend(qa)
    if pb is None:
        return False
    model_py, config = _PB_STANDINS[name]
    (models / name / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(pb / "examples" / "decoupled" / model_py, models / name / "1" / "model.py")
    shutil.copy(pb / "examples" / "decoupled" / config, models / name / "config.pbtxt")
    return True


STANDINS = Path(__file__).resolve().parent / "standins"


def repeat_non_decoupled(qa, models: Path, name: str, policy: str) -> bool:
    """models/<name>: repeat_int32's config with `policy` in place of its decoupled one, run by
    standins/repeat.py (the C++ repeat backend without decoupled responses)."""
    if not _standin(qa, models, "repeat_int32"):
        return False
    if name != "repeat_int32":
        _copytree(models / "repeat_int32", models / name)
        _sed(models / name / "config.pbtxt", "repeat_int32", name)
    _sed(models / name / "config.pbtxt", r"model_transaction_policy \{\s*decoupled: True\s*\}\n?", policy)
    shutil.copy(STANDINS / "repeat.py", models / name / "1" / "model.py")
    return True


def _skip_all(qa, module: str, cases, why: str) -> None:
    for case in cases:
        qa.record(module, case, "skip", why)


# ====================================================================== L0_decoupled
DECOUPLED_TESTS = ("test_one_to_none", "test_one_to_one", "test_one_to_many", "test_no_streaming",
                   "test_response_order", "test_wrong_shape")


def _decoupled_models(qa, d: Path) -> Path:
    """test.sh's python_models: its models/ with the python repeat and square models (Dockerfile.QA)."""
    models = _fresh(d / "python_models")
    for src in sorted((d / "models").iterdir()):
        if (src / "config.pbtxt").exists() and src.name not in _PB_STANDINS:
            _copytree(src, models / src.name)
            (models / src.name / "1").mkdir(exist_ok=True)
    for name in _PB_STANDINS:
        _standin(qa, models, name)
    lt = models / "libtorch_nobatch_int32_int32_int32"
    _copytree(qa.data / "qa_model_repository" / lt.name, lt)
    _sed(lt / "config.pbtxt", r"dims:.*\[.*\]", "dims: [ 1 ]")
    return models


DECOUPLED_TRIALS = "python python.grpc_max_response_pool_size_1 non_decoupled"


def l0_decoupled(qa) -> None:
    """test.sh's python trials (the second with --grpc-max-response-pool-size=1), then its
    non-decoupled one; `QA_DECOUPLED_TRIALS` picks some of them (default: all, as test.sh)."""
    d = qa.qa / "L0_decoupled"
    trials = os.environ.get("QA_DECOUPLED_TRIALS", DECOUPLED_TRIALS).split()
    names = [f"DecoupledTest.{t}" for t in DECOUPLED_TESTS] + ["DecoupledTest.test_one_to_multi_many"]
    if _python_backend(qa) is None:
        _skip_all(qa, "decoupled_test.py", names + ["NonDecoupledTest"],
                  "needs QA_PYTHON_BACKEND (repeat_int32 and square_int32 are its decoupled examples)")
        return
    _note(qa, "the custom trial: its repeat_int32 and square_int32 are Triton's C++ repeat and square "
              "backends, whose python stand-ins are the python trial's models")
    models = _decoupled_models(qa, d)
    for label, extra in (("python", ""), ("python.grpc_max_response_pool_size_1", " --grpc-max-response-pool-size=1")):
        if label not in trials:
            continue
        s = qa.start(d, f"--model-repository={models}{extra}", f"{label}.server.log")
        # every trial streams through the four ensembles too (thousands of responses, each a second
        # apart in places): over the runner's usual 30 minutes on two cores
        qa.unittest(d, "decoupled_test.py", [f"DecoupledTest.{t}" for t in DECOUPLED_TESTS], variant=label, server=s,
                    timeout=5400)
        if not extra:
            # test.sh exports this for the client only (the server is already running)
            qa.unittest(d, "decoupled_test.py", ["DecoupledTest.test_one_to_multi_many"], variant=label,
                        env={"TRITONSERVER_DELAY_GRPC_RESPONSE": "2000"}, server=s)
        if s:
            s.stop()
    if "non_decoupled" not in trials:
        return
    # test.sh's non_decoupled_models/repeat_int32: the C++ repeat backend with decoupled: False
    non_decoupled = _fresh(d / "non_decoupled_models")
    repeat_non_decoupled(qa, non_decoupled, "repeat_int32", "model_transaction_policy {\n  decoupled: False\n}\n")
    s = qa.start(d, f"--model-repository={non_decoupled}", "non_decoupled_inference_server.log")
    qa.unittest(d, "decoupled_test.py", ["NonDecoupledTest"], variant="non_decoupled", server=s)
    if s:
        s.stop()


# ====================================================================== L0_request_cancellation
GRPC_CANCELLATION_TESTS = (
    "test_grpc_async_infer", "test_grpc_stream_infer", "test_aio_grpc_async_infer", "test_aio_grpc_stream_infer")
# cases timed against hooks that stall Triton's gRPC state machine at one step (the client's sleeps
# are computed from them); at_step_start also counts Triton's "New request handler" log lines
GRPC_STATE_MACHINE_TESTS = (
    "test_grpc_async_infer_cancellation_at_step_start",
    "test_grpc_async_infer_response_complete_during_cancellation",
    "test_grpc_async_infer_cancellation_before_finish_0", "test_grpc_async_infer_cancellation_before_finish_1",
    "test_grpc_async_infer_cancellation_before_response_complete_and_process_after_final_response")


def _identity(models: Path, name: str, max_batch: int, dtype: str, tail: str) -> None:
    (models / name / "1").mkdir(parents=True)
    (models / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch}\n'
        f'input [{{ name: "INPUT0" \n data_type: {dtype} \n dims: [ -1 ] }}]\n'
        f'output [{{ name: "OUTPUT0" \n data_type: {dtype} \n dims: [ -1 ] }}]\n' + tail)


def l0_request_cancellation(qa) -> None:
    d = qa.qa / "L0_request_cancellation"
    _note(qa, "request_cancellation_test and grpc_cancellation_test (C++ programs); the count of Triton's "
              "'Cancellation notification received' and 'StateRelease' log lines and the "
              "TRITONSERVER_DELAY_GRPC_*/TRITONSERVER_DELAY_RESPONSE_* hooks (Triton's gRPC state machine)")
    models = _fresh(d / "models")
    _identity(models, "custom_identity_int32", 1024, "TYPE_INT32",
              'instance_group [{ kind: KIND_CPU }]\n'
              'parameters [{ key: "execute_delay_ms" \n value: { string_value: "10000" } }]\n')
    _skip_all(qa, "grpc_cancellation_test.py", [f"GrpcCancellationTest.{t}" for t in GRPC_STATE_MACHINE_TESTS],
              "timed against TRITONSERVER_DELAY_GRPC_*/TRITONSERVER_DELAY_RESPONSE_* hooks inside Triton's gRPC "
              "state machine (Triton internals)")
    for case in GRPC_CANCELLATION_TESTS:
        s = qa.start(d, f"--model-repository={models} --log-verbose=2", f"grpc_cancellation_test.{case}.server.log")
        qa.unittest(d, "grpc_cancellation_test.py", [f"GrpcCancellationTest.{case}"], server=s)
        if s:
            s.stop()

    models = _fresh(d / "models")
    delay = 'parameters [{ key: "execute_delay_ms" \n value: { string_value: "6000" } }]\n'
    one = "instance_group [{ count: 1 \n kind: KIND_CPU }]\n"
    _identity(models, "dynamic_batch", 2, "TYPE_FP32",
              one + "dynamic_batching { max_queue_delay_microseconds: 600000 }\n" + delay)
    _identity(models, "sequence_direct", 1, "TYPE_FP32",
              one + "sequence_batching { direct { } \n max_sequence_idle_microseconds: 6000000 }\n" + delay)
    _identity(models, "sequence_oldest", 1, "TYPE_FP32",
              one + "sequence_batching { oldest { max_candidate_sequences: 1 } \n "
                    "max_sequence_idle_microseconds: 6000000 }\n" + delay)
    step = ('{{ model_name: "dynamic_batch" \n model_version: -1 \n input_map {{ key: "INPUT0" \n value: "{i}" }} \n'
            ' output_map {{ key: "OUTPUT0" \n value: "{o}" }} }}')
    (models / "ensemble_model" / "1").mkdir(parents=True)
    (models / "ensemble_model" / "config.pbtxt").write_text(
        'name: "ensemble_model"\nplatform: "ensemble"\nmax_batch_size: 1\n'
        'input [{ name: "INPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" \n data_type: TYPE_FP32 \n dims: [ -1 ] }]\n'
        "ensemble_scheduling { step [\n" + step.format(i="INPUT0", o="out") + ",\n"
        + step.format(i="out", o="OUTPUT0") + "\n] }\n")
    s = qa.start(d, f"--model-repository={models} --log-verbose=2", "scheduler_test.server.log")
    qa.unittest(d, "scheduler_test.py", server=s)
    if s:
        s.stop()

    models = _fresh(d / "models")
    (models / "sequence_state" / "1").mkdir(parents=True)
    shutil.copy(d / "implicit_state_model" / "config.pbtxt", models / "sequence_state")
    shutil.copy(d / "implicit_state_model" / "model.pt", models / "sequence_state" / "1")
    log = "implicit_state_test.server.log"
    s = qa.start(d, f"--model-repository={models} --log-verbose=1", log)
    qa.unittest(d, "implicit_state_test.py", server=s, env={"SERVER_LOG": str(qa.results / f"{qa.suite}.{log}")})
    if s:
        s.stop()


# ====================================================================== L0_grpc_state_cleanup
CLEANUP_TESTS = ("test_simple_infer", "test_simple_infer_cancellation", "test_simple_infer_timeout",
                 "test_streaming_infer", "test_streaming_timeout", "test_streaming_cancellation",
                 "test_decoupled_infer", "test_decoupled_cancellation", "test_decoupled_timeout",
                 "test_non_decoupled_streaming_multi_response")
ERROR_STATUS_TESTS = ("test_simple_infer_error_status", "test_streaming_error_status", "test_decoupled_error_status")
SHUTDOWN_TESTS = ("test_simple_infer_shutdownserver", "test_streaming_infer_shutdownserver",
                  "test_decoupled_infer_shutdownserver", "test_decoupled_infer_with_params_shutdownserver")


def l0_grpc_state_cleanup(qa) -> None:
    d = qa.qa / "L0_grpc_state_cleanup"
    every = [f"CleanUpTest.{t}" for t in (*CLEANUP_TESTS, *ERROR_STATUS_TESTS, *SHUTDOWN_TESTS,
                                          "test_decoupled_infer_complete")]
    models = _fresh(d / "models")
    if not _standin(qa, models, "repeat_int32"):
        _skip_all(qa, "cleanup_test.py", every, "needs QA_PYTHON_BACKEND (repeat_int32 is its decoupled example)")
        return
    _note(qa, "check_state_release (Triton's gRPC frontend state objects in its log); "
              "TRITONSERVER_DELAY_GRPC_COMPLETE (a hook inside Triton's gRPC state machine)")
    custom = models / "custom_zero_1_float32"
    _copytree(qa.qa / "custom_models" / "custom_zero_1_float32", custom)
    (custom / "1").mkdir(exist_ok=True)
    _append(custom / "config.pbtxt", 'parameters [\n{ key: "execute_delay_ms"; value: { string_value: "1000" }}\n]')
    # test.sh's repeat_int32_non_decoupled: the C++ repeat backend without its decoupled policy
    repeat_non_decoupled(qa, models, "repeat_int32_non_decoupled", "")
    args = f"--model-repository={models} --log-verbose=2"
    for case in CLEANUP_TESTS:
        s = qa.start(d, args, f"{case}.server.log")
        qa.unittest(d, "cleanup_test.py", [f"CleanUpTest.{case}"], server=s)
        if s:
            s.stop()
    for case in ERROR_STATUS_TESTS:
        s = qa.start(d, args + " --grpc-restricted-protocol=inference:infer-key=infer-value", f"{case}.server.log")
        qa.unittest(d, "cleanup_test.py", [f"CleanUpTest.{case}"], server=s)
        if s:
            s.stop()
    for case in SHUTDOWN_TESTS:
        s = qa.start(d, args, f"{case}.server.log")
        # test.sh passes SERVER_PID in the environment, which the module reads only as __main__
        pid = str(s.proc.pid) if s else ""
        qa.unittest(d, "cleanup_test.py", [f"CleanUpTest.{case}"], server=s,
                    env={"SERVER_PID": pid, "QA_PATCH": json.dumps({"CleanUpTest.SERVER_PID": pid})})
        if s:
            code = s.stop()
            qa.check(f"{case}: server exits after SIGINT", code == 0, f"exit status {code}")
    log = "test_decoupled_infer_complete.server.log"
    s = qa.start(d, args, log)
    qa.unittest(d, "cleanup_test.py", ["CleanUpTest.test_decoupled_infer_complete"], server=s,
                env={"SERVER_LOG": str(qa.results / f"{qa.suite}.{log}")})
    if s:
        s.stop()


# ====================================================================== L0_client_timeout
INFER_TIMEOUT_TESTS = ("test_grpc_infer", "test_grpc_async_infer", "test_grpc_stream_infer", "test_http_infer",
                       "test_http_async_infer")


def l0_client_timeout(qa) -> None:
    d = qa.qa / "L0_client_timeout"
    _note(qa, "client_timeout_test (C++ program), with the explicit-mode server started for it alone")
    models = d / "models"
    (models / "custom_identity_int32" / "1").mkdir(parents=True, exist_ok=True)
    s = qa.start(d, f"--model-repository={models} --log-verbose 2", "infer.server.log")
    qa.unittest(d, "client_infer_timeout_test.py", [f"ClientInferTimeoutTest.{t}" for t in INFER_TIMEOUT_TESTS],
                server=s)
    if s:
        s.stop()
    # the non-inference deadlines, with Triton's test hook holding each such gRPC call 2 s
    env = {"TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": "2"}
    s = qa.start(d, f"--model-repository={models} --log-verbose 2 --model-control-mode=explicit "
                    "--allow-client-shm=true --load-model=custom_identity_int32 --log-verbose 2",
                 "non_infer.server.log", env=env)
    qa.unittest(d, "client_non_infer_timeout_test.py", server=s)
    if s:
        s.stop()
