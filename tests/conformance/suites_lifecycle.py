"""L0_lifecycle: the start-up, port-collision, version-directory and explicit model-control
cases of its test.sh (see qa_suites.py). Not run here: the polling cases (poll mode does not
rescan in tritond yet), and the cases built on OpenVINO, TensorRT or sequence models."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from suites_http import _copytree, _fresh, _note, _sed

SLEEP_TIME = 10
DEFAULT_ADDRESS = "127.0.0.1"     # tritond binds loopback unless told otherwise (README, security)


def _version() -> str:
    from tritond.frontend.metadata import SERVER_VERSION
    return SERVER_VERSION


def _one(qa, d: Path, args: str, test: str, log: str, wait: str = "ready") -> None:
    env = {"TRITON_SERVER_VERSION": _version()}
    s = qa.start(d, args, log, wait=wait, timeout=SLEEP_TIME if wait == "none" else None)
    qa.unittest(d, "lifecycle_test.py", [f"LifeCycleTest.{test}"], env=env, server=s)
    if s:
        s.stop()


def run(qa) -> None:
    d = qa.qa / "L0_lifecycle"
    data = qa.data / "qa_model_repository"
    ens = qa.data / "qa_ensemble_model_repository" / "qa_model_repository"
    _note(qa, "polling cases, and cases built on OpenVINO, TensorRT or sequence models")

    for args in ("--model-repository=/tmp/xyzx --strict-readiness=true --exit-on-error=false",
                 "--model-repository=/tmp/xyzx --strict-readiness=false --exit-on-error=false",
                 f"--model-repository=/tmp/xyzx --model-repository={_fresh(d / 'models')} "
                 f"--strict-readiness=true --exit-on-error=false",
                 f"--model-repository={_fresh(d / 'models')} --model-repository=/tmp/xyzx "
                 f"--strict-readiness=false --exit-on-error=false"):
        _one(qa, d, args, "test_parse_error_noexit", "noexit.server.log", wait="none")

    models = _fresh(d / "models")
    print(f"  (deviation: the collision message names {DEFAULT_ADDRESS}, tritond's default address; "
          f"tritonserver's is 0.0.0.0)", flush=True)
    for name, second in (("GRPC", "--http-port 8003 --metrics-port 8004"),
                         ("HTTP", "--grpc-port 8003 --metrics-port 8004"),
                         ("Metrics", "--grpc-port 8003 --http-port 8004")):
        first = qa.start(d, f"--model-repository={models}", f"stub.{name}.server.log")
        port = {"GRPC": 8001, "HTTP": 8000, "Metrics": 8002}[name]
        text = _collision(qa, d, f"--model-repository={models} {second}", f"collision.{name}.server.log")
        qa.check(f"port collision: {name}", f"failed to start {name} service: Unavailable - Socket "
                                            f"'{DEFAULT_ADDRESS}:{port}' already in use" in text, text[-300:])
        if first:
            first.stop()
    first = qa.start(d, f"--model-repository={models}", "stub.multi.server.log")
    text = _collision(qa, d, f"--model-repository={models}", "collision.multi.server.log")
    qa.check("port collision: several", re.search(r"failed to start.*service: Unavailable - Socket '.*' "
                                                   r"already in use", text) is not None, text[-300:])
    second = qa.start(d, f"--model-repository={models} --grpc-port 8003 --http-port 8004 --metrics-port 8005",
                      "no_collision.server.log", free_ports=False, wait="none", timeout=SLEEP_TIME)
    qa.check("no port collision", second is not None, qa.last_start_error)
    for s in (second, first):
        if s:
            s.stop()

    for dirname, test, grep in (("003", "test_parse_ignore_zero_prefixed_version",
                                 "ignore version directory '003' which contains leading zeros in its directory name"),
                                ("abc", "test_parse_ignore_non_intergral_version",
                                 "ignore version directory 'abc' which fails to convert to integral number")):
        models = _fresh(d / "models")
        _copytree(data / "libtorch_float32_float32_float32", models / "libtorch_float32_float32_float32")
        shutil.move(models / "libtorch_float32_float32_float32" / "3", models / "libtorch_float32_float32_float32" / dirname)
        log = f"{test}.server.log"
        _one(qa, d, f"--model-repository={models} --exit-on-error=false --exit-timeout-secs=5", test, log)
        text = (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
        qa.check(f"{test}: log says '{grep}'", grep in text, text[-300:])

    models = _fresh(d / "models")
    _copytree(data / "onnx_float32_float32_float32", models / "onnx_float32_float32_float32")
    _copytree(data / "libtorch_float32_float32_float32", d / "libtorch_float32_float32_float32")
    _one(qa, d, f"--model-repository={models} --model-control-mode=none --exit-timeout-secs=5",
         "test_dynamic_model_load_unload_disabled", "load_unload_disabled.server.log")
    shutil.rmtree(d / "libtorch_float32_float32_float32", ignore_errors=True)

    models = _fresh(d / "models")
    _copytree(data / "libtorch_int32_int32_int32", models / "libtorch_int32_int32_int32")
    _one(qa, d, f"--model-repository={models} --model-control-mode=none --exit-timeout-secs=5",
         "test_dynamic_version_load_unload_disabled", "version_disabled.server.log")

    explicit = "--model-control-mode=explicit --exit-timeout-secs=5 --strict-model-config=false --strict-readiness=false"
    for test, ensemble, empty in (("test_model_control", True, False), ("test_model_control_fail", False, True),
                                  ("test_model_control_ensemble", True, False)):
        models = _fresh(d / "models")
        _copytree(data / "onnx_float32_float32_float32", models / "onnx_float32_float32_float32")
        _sed(models / "onnx_float32_float32_float32" / "config.pbtxt", r"max_batch_size:.*", "max_batch_size: 1")
        if ensemble:
            _copytree(ens / "simple_onnx_float32_float32_float32", models / "simple_onnx_float32_float32_float32")
            _sed(models / "simple_onnx_float32_float32_float32" / "config.pbtxt", r"max_batch_size:.*",
                 "max_batch_size: 1")
        if empty:
            for f in models.glob("onnx_float32_float32_float32/*/*"):
                f.unlink()
        _one(qa, d, f"--model-repository={models} {explicit}", test, f"{test}.server.log")


def _collision(qa, d: Path, args: str, log: str) -> str:
    """Start a second server on a port the first holds; returns its log."""
    s = qa.start(d, args, log, free_ports=False, wait="none", timeout=SLEEP_TIME)
    if s:
        s.stop()
    return (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
