"""L0_backend_python: its top-level test.sh and each CPU sub-suite it runs (see qa_suites.py).

Mirrored per sub-suite: the models test.sh copies from qa/python_models, the server flags and
environment, the pytest/unittest modules, and what test.sh greps or counts in shell (a case of
the pseudo-module `test.sh`). `QA_PYTHON_SUBTESTS` picks sub-suites (default: all of SUBTESTS).

Deviations, each printed when it applies:
- `shm_util.ShmLeakDetector` reads the free bytes of Triton's own python-backend regions
  (`/dev/shm/triton_python_backend_shm_region_*`) through Triton's C extension
  `triton_shm_monitor`. Those regions are Triton internals that tritond does not have, so the
  probe has nothing of tritond's to watch; the runner puts a `triton_shm_monitor` on the clients'
  path that reads any region of that name (another process's) as unchanged, and checks instead (as test.sh's `get_shm_pages` means
  to) that no shared-memory segment of the server is left in /dev/shm once it has stopped.
- A python stub process (`triton_python_backend_stub`, `pgrep --parent`) is a tritond worker.
- Models from the python_backend repository (`square_int32`, the `examples` sub-suite) come from
  `QA_PYTHON_BACKEND` (a python_backend work tree or its bare git directory); without it those
  are skipped.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from suites_http import BACKEND_DIR, _append, _copytree, _curl, _fresh, _sed
from suites_models import _cpu_kind
from suites_observe import _tests_of

GPU = "needs a GPU (CUDA tensors or a KIND_GPU model)"
CASE_TIMEOUT = 600
SUBTESTS = ("main", "ensemble", "bls", "decoupled", "response_sender", "io", "async_execute",
            "lifecycle", "argument_validation", "logging", "custom_metrics", "parameters",
            "model_control", "request_rescheduling", "model_readiness", "examples", "python_based_backends")
RESTARTED = ("tritond restarts a dead worker at once (crash isolation), so the model is READY again when the test "
             "asks a second after the kill (the check below: ready and serving); Triton's python backend restarts "
             "its stub only at the next request, and reads not ready until then")
NOT_RUN = {
    "variants": "builds the python backend stub with cmake and apt packages (downloads)",
    "env": "installs miniconda and conda-packs execution environments (downloads)",
    "restart": "not in L0_backend_python/test.sh's SUBTESTS (disabled upstream)",
}
SHM_MONITOR_SHIM = '''"""Stand-in for Triton's triton_shm_monitor C extension (see suites_python_backend.py): a
region of Triton's name is another process's, never tritond's, so it reads as unchanged."""


class SharedMemoryManager:
    def __init__(self, name):
        self.name = name

    def free_memory(self):
        return 0
'''


# ====================================================================== helpers
def _env(qa) -> dict[str, str]:
    shim = qa.results / "pyb_shim"
    shim.mkdir(exist_ok=True)
    (shim / "triton_shm_monitor.py").write_text(SHM_MONITOR_SHIM)
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "TEST_JETSON": "0", "TEST_WINDOWS": "0"}


def _model(qa, models: Path, src: str, name: str | None = None, files: tuple[str, ...] = ("model.py",),
           base: Path | None = None, keep_name: bool = False) -> Path:
    """mkdir -p models/<name>/1; cp <src>/model.py models/<name>/1/; cp <src>/config.pbtxt; sed name
    (unless keep_name: test.sh copies some configs unchanged)."""
    root = (base or qa.qa / "python_models") / src
    dest = models / (name or src)
    (dest / "1").mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(root / f, dest / "1" / ("model.py" if f == files[0] and f.endswith("_model.py") else f))
    if (root / "config.pbtxt").exists():
        shutil.copy(root / "config.pbtxt", dest / "config.pbtxt")
        if name and not keep_name:
            _sed(dest / "config.pbtxt", r"(?m)^name:.*", f'name: "{name}"')
    return dest


def _args(models: Path, extra: str = "") -> str:
    return f"--model-repository={models} --backend-directory={BACKEND_DIR} --log-verbose=1 {extra}".strip()


def _server_id(server) -> str:
    m = re.search(r"server id ([0-9a-f]{32})", server.text()) if server else None
    return m.group(1) if m else ""


def _stop(qa, server, case: str) -> None:
    """kill_server, then test.sh's shared-memory check: nothing of this server left in /dev/shm."""
    if server is None:
        return
    sid = _server_id(server)
    server.stop()
    time.sleep(1)
    left = [n for n in os.listdir("/dev/shm") if sid and sid in n]
    qa.check(f"{case}: shared memory cleaned up", not left, f"left in /dev/shm: {left}")


def _log_as(path: Path, server) -> None:
    """The server's log where test.sh's SERVER_LOG puts it (a test module reads it by that name)."""
    path.unlink(missing_ok=True)
    if server is not None:
        path.symlink_to(server.log)


def _workers(server, model: str = "") -> list[int]:
    """The worker processes (Triton's python stubs) of a server, for one model or all."""
    sid, pids = _server_id(server), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(f"tritond-worker server={sid} ") and (not model or f" model={model} " in cmd):
            pids.append(int(pid))
    return pids


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _pytest(qa, cwd: Path, target: str, server, env: dict[str, str] | None = None, variant: str = "",
            skip: dict[str, str] | None = None, timeout: float = 1800) -> None:
    """`python3 -m pytest <target>` from cwd, one record per case from its junit report; `skip`
    maps Class.test to why it is not run (a GPU). With pytest-timeout, a case may take
    CASE_TIMEOUT seconds."""
    module = target.split("::")[0]
    for case, why in (skip or {}).items():
        qa.record(module, case + (f"[{variant}]" if variant else ""), "skip", why)
    if server is None:
        qa.record(module, target + (f"[{variant}]" if variant else ""), "error",
                  f"server did not start: {qa.last_start_error}")
        return
    report = qa.results / "pytest.xml"
    report.unlink(missing_ok=True)
    log = qa.results / f"{qa.suite}.client.log"
    with open(log, "a") as out:
        out.write(f"\n=== pytest {target} {variant}\n")
        out.flush()
        try:
            deselect = [f"--deselect={module}::{case.replace('.', '::')}" for case in skip or {}]
            per_case = [f"--timeout={CASE_TIMEOUT}"] if importlib.util.find_spec("pytest_timeout") else []
            subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *per_case,
                            f"--junitxml={report}", *deselect, target],
                           cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                           env=dict(os.environ, **_env(qa), **(env or {})))
        except subprocess.TimeoutExpired:
            pass
    if not report.exists():
        qa.record(module, target + (f"[{variant}]" if variant else ""), "error", "no result (timeout or crash)")
        return
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}" + (f"[{variant}]" if variant else "")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            qa.record(module, name, "fail", (bad.get("message") or "") + "\n" + (bad.text or "")[-1500:])
        elif skipped is not None:
            qa.record(module, name, "skip", skipped.get("message") or "")
        else:
            qa.record(module, name, "pass")


def _skip(qa, module: str, case: str, why: str) -> None:
    qa.record(module, case, "skip", why)


def _log_count(server, text: str) -> int:
    return server.text().count(text) if server else -1


def _python_backend(qa) -> Path | None:
    """The python_backend checkout named by QA_PYTHON_BACKEND, exported under the work dir."""
    src = os.environ.get("QA_PYTHON_BACKEND", "")
    if not src:
        return None
    dest = qa.results.parent / "python_backend"
    if (Path(src) / "examples").is_dir():
        _copytree(Path(src), dest)
    else:
        _fresh(dest)
        archive = subprocess.run(["git", f"--git-dir={src}", "archive", "HEAD", "examples"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _refused(qa, cwd: Path, args: str, log: str, case: str, expect: list[str], env=None) -> None:
    server = qa.start(cwd, args, log, env=env, timeout=120)
    if server is not None:
        qa.check(case, False, "unexpected success starting the server")
        server.stop()
        return
    text = (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
    missing = [e for e in expect if e not in text]
    qa.check(case, not missing, f"log lacks {missing}: {text[-400:]}")


# ====================================================================== top level test.sh
def _main(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for name in ("identity_fp32", "identity_bf16", "delayed_model", "init_args", "optional", "non_contiguous",
                 "string", "string_fixed", "dlpack_identity"):
        _model(qa, models, name)
    _model(qa, models, "pytorch_fp32_fp32", "pytorch_fp32_fp32")
    triton_dir = {"TRITON_DIR": str(qa.qa.parent)}       # init_args expects <TRITON_DIR>/qa/... as its repository
    _sed(models / "init_args" / "config.pbtxt", "TRITON_DIR_PATH", triton_dir["TRITON_DIR"])
    for name, typ, extra in (("identity_uint8", "TYPE_UINT8", "batch"), ("identity_uint8_nobatch", "TYPE_UINT8", "nobatch"),
                             ("identity_uint32", "TYPE_UINT32", ""), ("identity_bool", "TYPE_BOOL", "")):
        _copytree(models / "identity_fp32", models / name)
        cfg = models / name / "config.pbtxt"
        _sed(cfg, r"(?m)^name:.*", f'name: "{name}"')
        _sed(cfg, "TYPE_FP32", typ)
        if extra == "batch":
            _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 8")
            _append(cfg, "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }")
        elif extra == "nobatch":
            _sed(cfg, r"(?m)^max_batch_size:.*", "")
    _copytree(models / "identity_fp32", models / "default_model_name")
    (models / "default_model_name" / "1" / "model.py").rename(models / "default_model_name" / "1" / "mymodel.py")
    _sed(models / "default_model_name" / "config.pbtxt", r"(?m)^name:.*", 'name: "default_model_name"')
    _append(models / "default_model_name" / "config.pbtxt", 'default_model_filename: "mymodel.py"')

    shm = "--backend-config=python,shm-default-byte-size=5242880"
    s = qa.start(d, _args(models, f"--allow-client-shm=true {shm}"), "main.server.log", env=triton_dir)
    _pytest(qa, d, "python_test.py", s, skip={
        "PythonTest.test_gpu_tensor_error": GPU, "PythonTest.test_dlpack_tensor_error": GPU,
        "PythonTest.test_growth_error": "Triton internals: it fills the python backend's own shared-memory pool past "
                                        "the 1 GiB /dev/shm of Triton's CI container; tritond has no such pool (it "
                                        "refuses the 1 GiB body at --http-max-input-size instead)"})
    _stop(qa, s, "python_test.py server")

    s = qa.start(d, _args(models, shm), "nongraceful.server.log", env=triton_dir)
    if s is None:
        qa.check("non-graceful exit: server starts", False, qa.last_start_error)
    else:
        time.sleep(5)
        procs = _descendants(s.proc.pid)
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait()
        time.sleep(10)
        alive = [p for p in procs if Path(f"/proc/{p}").exists()]
        qa.check("non-graceful exit: every child process exits", not alive, f"still running: {alive}")
        for p in alive:
            os.kill(p, signal.SIGKILL)

    _skip(qa, "test.sh", "KIND_GPU model (add_sub_gpu)", GPU)

    models = _fresh(d / "models")
    mf = models / "multi_file"
    (mf / "1").mkdir(parents=True)
    for f in (qa.qa / "python_models" / "multi_file").glob("*.py"):
        shutil.copy(f, mf / "1")
    shutil.copy(qa.qa / "python_models" / "identity_fp32" / "config.pbtxt", mf)
    _sed(mf / "config.pbtxt", r"(?m)^name:.*", 'name: "multi_file"')
    s = qa.start(d, _args(models, shm), "multi_file.server.log")
    qa.check("multi-file model loads", s is not None, qa.last_start_error)
    _stop(qa, s, "multi-file model")

    models = _fresh(d / "models")
    _model(qa, models, "model_env")
    s = qa.start(d, _args(models, shm), "model_env.server.log", env={"MY_ENV": "MY_ENV"})
    qa.check("environment variable reaches the model", s is not None, qa.last_start_error)
    _stop(qa, s, "model_env")

    _skip(qa, "test.sh", "shm-default-byte-size sizes triton_python_backend_shm regions",
          "the size of Triton's own python-backend shm regions is a Triton internal (tritond has none)")

    models = _fresh(d / "models")
    _model(qa, models, "init_exit")
    _refused(qa, d, _args(models, shm), "init_exit.server.log", "model exiting in initialize fails the load",
             ["Stub process 'init_exit_0_0' is not healthy."])

    models = _fresh(d / "models")
    (models / "non_existent_model" / "1").mkdir(parents=True)
    shutil.copy(qa.qa / "python_models" / "identity_fp32" / "config.pbtxt", models / "non_existent_model")
    _sed(models / "non_existent_model" / "config.pbtxt", r"(?m)^name:.*", 'name: "non_existent_model"')
    for mode, extra in (("default", ""), ("auto_config_disabled", "--disable-auto-complete-config")):
        _refused(qa, d, _args(models, extra), f"non_existent_model.{mode}.server.log",
                 f"missing model.py refused [{mode}]",
                 [f"Failed to preinitialize Python stub: Python model file not found in "
                  f"'{models}/non_existent_model/1/model.py'", "failed to load 'non_existent_model'"])


# ====================================================================== sub-suites
def _ensemble(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "ensemble", files=())
    for n in ("add_sub_1", "add_sub_2"):
        _model(qa, models, "add_sub", n, keep_name=True)
    print("  (deviation: ensemble_gpu and its KIND_GPU libtorch model left out; no GPU)", flush=True)
    s = qa.start(d, _args(models), "ensemble.server.log")
    _pytest(qa, d, "ensemble_test.py::EnsembleTest::test_ensemble", s)
    _skip(qa, "ensemble_test.py", "EnsembleTest.test_ensemble_gpu", GPU)
    _stop(qa, s, "ensemble")


def _bls(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for n in ("bls", "dlpack_add_sub", "bls_async", "bls_memory", "bls_memory_async", "add_sub", "execute_error",
              "identity_fp32", "dlpack_identity", "dlpack_square", "identity_fp32_timeout"):
        _model(qa, models, n)
    _copytree(qa.data / "qa_sequence_implicit_model_repository" / "onnx_nobatch_sequence_int32",
              models / "onnx_nobatch_sequence_int32")
    _cpu_kind(qa, models / "onnx_nobatch_sequence_int32" / "config.pbtxt")
    pb = _python_backend(qa)
    if pb:
        _model(qa, models, "decoupled", "square_int32", ("square_model.py",), base=pb / "examples")
        shutil.copy(pb / "examples" / "decoupled" / "square_config.pbtxt", models / "square_int32" / "config.pbtxt")
    libtorch = qa.data / "qa_model_repository" / "libtorch_nobatch_float32_float32_float32"
    for name, kind in (("libtorch_gpu", "KIND_GPU"), ("libtorch_cpu", "KIND_CPU")):
        _copytree(libtorch, models / name)
        _sed(models / name / "config.pbtxt", "libtorch_nobatch_float32_float32_float32", name)
        _append(models / name / "config.pbtxt", f"instance_group [ {{ kind: {kind}}} ]")
    _cpu_kind(qa, models / "libtorch_gpu" / "config.pbtxt")
    for pool in (64, 256):
        for trial in ("non_decoupled", "decoupled"):
            env = {"BLS_KIND": trial}
            s = qa.start(d, _args(models, f"--cuda-memory-pool-byte-size=0:{pool * 1024 * 1024}"),
                         f"bls_{trial}.{pool}.server.log", env=env)
            for name in ("bls", "bls_memory", "bls_memory_async", "bls_async"):
                variant = f"{name},{trial},{pool}MB"
                if name in ("bls", "bls_async"):       # their unittest suites hold CUDA tensor cases
                    _skip(qa, "../test_infer_shm_leak.py", f"TestInferShmLeak.test_shm_leak[{variant}]", GPU)
                    continue
                _pytest(qa, d, "../test_infer_shm_leak.py", s, env=dict(env, MODEL_NAME=name), variant=variant)
            _skip(qa, "test.sh", f"bls {trial} {pool}MB: log has 'Request timeout: 11000000000'",
                  "Triton internals: a verbose log line of Triton's core, from the bls model's CUDA-bound suite")
            _stop(qa, s, f"bls {trial} {pool}MB")

    message = "BLS is only supported during the 'execute' function."
    models = _fresh(d / "models")
    _model(qa, models, "bls_init_error")
    _refused(qa, d, _args(models), "bls_init_error.server.log", "BLS in initialize refused", [message])

    models = _fresh(d / "models")
    _model(qa, models, "bls_finalize_error")
    s = qa.start(d, _args(models), "bls_finalize_error.server.log")
    qa.check("bls_finalize_error loads", s is not None, qa.last_start_error)
    if s is not None:
        _stop(qa, s, "bls_finalize_error")
        qa.check("BLS in finalize refused", message in s.text(), "message not in the server log")

    models = _fresh(d / "models")
    _model(qa, models, "bls_model_loading")
    _copytree(qa.data / "qa_model_repository" / "onnx_int32_int32_int32", models / "onnx_int32_int32_int32")
    shutil.rmtree(models / "onnx_int32_int32_int32" / "1")
    url = "http://localhost:8000/v2/repository/models/bls_model_loading/load"
    for warmup in (False, True):
        if warmup:
            _append(models / "bls_model_loading" / "config.pbtxt", WARMUP)
        s = qa.start(d, _args(models, "--model-control-mode=explicit"),
                     f"bls_model_loading{'_warmup' if warmup else ''}.server.log")
        if s is None:
            qa.check(f"bls_model_loading{' (warmup)' if warmup else ''}: server starts", False, qa.last_start_error)
            continue
        # its initialize() runs the model's unittest, whose every tearDown sleeps 30 s (test.sh's curl waits)
        code, body = _curl("", url, timeout=600)
        qa.check(f"bls_model_loading{' (warmup)' if warmup else ''}: load is not refused", code != 400, body)
        if not warmup:
            _pytest(qa, d, "../test_infer_shm_leak.py", s, env={"MODEL_NAME": "bls_model_loading"},
                    variant="bls_model_loading")
        _stop(qa, s, f"bls_model_loading{' warmup' if warmup else ''}")

    params = _fresh(d / "params_models")
    _model(qa, params, "bls_parameters")
    s = qa.start(d, _args(params), "bls_parameters.server.log")
    qa.unittest(d, "bls_parameters_test.py", env=_env(qa), server=s)
    _stop(qa, s, "bls_parameters")


WARMUP = """model_warmup [{
    name : "regular sample"
    batch_size: 1
    inputs {
        key: "INPUT0"
        value: {
            data_type: TYPE_FP32
            dims: 4
            zero_data: false
        }
    }
    inputs {
        key: "INPUT1"
        value: {
            data_type: TYPE_FP32
            dims: 4
            zero_data: false
        }
    }
}]"""


def _decoupled(qa, d: Path) -> None:
    models = d / "models"
    _model(qa, models, "identity_fp32")
    _model(qa, models, "execute_cancel")
    _append(models / "execute_cancel" / "config.pbtxt", "model_transaction_policy { decoupled: True }")
    _model(qa, models, "response_sender_until_cancelled")
    _model(qa, models, "dlpack_add_sub")
    pb = _python_backend(qa)
    if pb:
        _model(qa, models, "decoupled", "square_int32", ("square_model.py",), base=pb / "examples")
        shutil.copy(pb / "examples" / "decoupled" / "square_config.pbtxt", models / "square_int32" / "config.pbtxt")
    s = qa.start(d, _args(models), "decoupled.server.log")
    _log_as(d / "decoupled_server.log", s)
    _pytest(qa, d, "decoupled_test.py", s, skip={"DecoupledTest.test_decoupled_bls": GPU})
    if s is not None:
        _stop(qa, s, "decoupled")
        for msg, want in (("Specific Msg!", None), ("Info Msg!", None), ("Warning Msg!", None), ("Error Msg!", None),
                          ("Finalize invoked", 3), ("Finalize complete...", 3)):
            n = _log_count(s, msg)
            qa.check(f"decoupled: log count of '{msg}'", n >= 1 if want is None else n == want, f"{n}")


def _response_sender(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for name, model_file, decoupled, batching in (
            ("response_sender", "model.py", False, False), ("response_sender_decoupled", "model.py", True, False),
            ("response_sender_async", "model_async.py", False, False),
            ("response_sender_decoupled_async", "model_async.py", True, False),
            ("response_sender_batching", "model.py", False, True),
            ("response_sender_decoupled_batching", "model.py", True, True),
            ("response_sender_async_batching", "model_async.py", False, True),
            ("response_sender_decoupled_async_batching", "model_async.py", True, True)):
        dest = models / name
        (dest / "1").mkdir(parents=True)
        src = qa.qa / "python_models" / "response_sender"
        shutil.copy(src / "model_common.py", dest / "1")
        shutil.copy(src / model_file, dest / "1" / "model.py")
        shutil.copy(src / "config.pbtxt", dest)
        if decoupled:
            _append(dest / "config.pbtxt", "model_transaction_policy { decoupled: True }")
        if batching:
            _append(dest / "config.pbtxt", "dynamic_batching { max_queue_delay_microseconds: 500000 }")
    s = qa.start(d, _args(models), "response_sender_test.server.log")
    _pytest(qa, d, "response_sender_test.py", s, env={"SERVER_LOG": str(s.log) if s else ""})
    _stop(qa, s, "response_sender")

    models = _fresh(d / "models")
    _model(qa, models, "response_sender_complete_final")
    s = qa.start(d, _args(models), "response_sender_complete_final_test.server.log")
    _pytest(qa, d, "response_sender_complete_final_test.py", s, env={"SERVER_LOG": str(s.log) if s else ""})
    _stop(qa, s, "response_sender_complete_final")


def _io(qa, d: Path) -> None:
    for trial in ("default", "decoupled"):      # each model puts its output on the GPU for some requests
        _skip(qa, "io_test.py", f"IOTest.test_ensemble_io[{trial}]", GPU)
    _skip(qa, "io_test.py", "IOTest.test_empty_gpu_output", GPU)
    _skip(qa, "io_test.py", "IOTest.test_variable_gpu_output", GPU)

    models = _fresh(d / "models")
    _model(qa, models, "add_sub")
    _model(qa, models, "dlpack_io_identity_decoupled")
    s = qa.start(d, _args(models), "io_requested_output.server.log")
    _pytest(qa, d, "io_test.py::IOTest::test_requested_output_default", s)
    _skip(qa, "io_test.py", "IOTest.test_requested_output_decoupled", GPU)
    _stop(qa, s, "io requested output")

    models = _fresh(d / "models")
    (models / "llm" / "1").mkdir(parents=True)
    shutil.copy(d / "requested_output_model" / "config.pbtxt", models / "llm")
    shutil.copy(d / "requested_output_model" / "model.py", models / "llm" / "1")
    s = qa.start(d, _args(models), "io_prior_crash.server.log")
    _pytest(qa, d, "io_test.py::IOTest::test_requested_output_decoupled_prior_crash", s)
    _stop(qa, s, "io prior crash")


def _async_execute(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "async_execute_decouple")
    _model(qa, models, "async_execute_decouple_bls")
    s = qa.start(d, _args(models), "concurrency_test.server.log")
    _pytest(qa, d, "concurrency_test.py", s, env={"SERVER_LOG": str(s.log) if s else ""})
    _stop(qa, s, "async_execute")


def _lifecycle(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for n in ("error_code", "execute_cancel", "execute_error", "execute_grpc_error", "decoupled_grpc_error",
              "execute_return_error"):
        _model(qa, models, n)
    _model(qa, models, "wrong_model", "wrong_model")
    for n, delay in (("execute_error", 12000000), ("execute_grpc_error", 1200000)):
        cfg = models / n / "config.pbtxt"
        _sed(cfg, r"(?m)^name:.*", f'name: "{n}"')
        _sed(cfg, r"(?m)^max_batch_size:.*", "max_batch_size: 8")
        _append(cfg, f"dynamic_batching {{ preferred_batch_size: [8], max_queue_delay_microseconds: {delay} }}")
    _sed(models / "wrong_model" / "config.pbtxt", "TYPE_FP32", "TYPE_UINT32")
    s = qa.start(d, _args(models), "lifecycle.server.log")
    _log_as(d / "lifecycle_server.log", s)
    for i in range(5):
        _pytest(qa, d, "lifecycle_test.py", s, variant=f"iter{i}")
    _stop(qa, s, "lifecycle")

    models = _fresh(d / "models")
    _model(qa, models, "init_error")
    _refused(qa, d, _args(models), "init_error.server.log", "init_error: error in initialize is logged",
             ["name 'lorem_ipsum' is not defined"])

    models = _fresh(d / "models")
    _model(qa, models, "fini_error")
    s = qa.start(d, _args(models), "fini_error.server.log")
    qa.check("fini_error loads", s is not None, qa.last_start_error)
    if s is not None:
        _stop(qa, s, "fini_error")
        qa.check("fini_error: error in finalize is logged", "name 'undefined_variable' is not defined" in s.text(),
                 "not in the server log")

    models = _fresh(d / "models")
    _model(qa, models, "auto_complete_error")
    _refused(qa, d, _args(models, "--strict-model-config=false"), "auto_complete_error.server.log",
             "auto_complete_error: error in auto_complete_config is logged", ["name 'undefined_variable' is not defined"])


def _argument_validation(qa, d: Path) -> None:
    s = qa.start(d, _args(d / "models"), "arg_validation.server.log")
    _pytest(qa, d, "../test_infer_shm_leak.py", s, env={"MODEL_NAME": "argument_validation"},
            variant="argument_validation")
    _stop(qa, s, "argument_validation")


def _logging(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "identity_fp32_logging")
    args = f"--model-repository={models} --backend-directory={BACKEND_DIR}"
    for sub, settings, counts in (("default", [], (4, 0)), ("verbose", ['{"log_verbose_level":1}'], (4, 3)),
                                  ("disabled", ['{"log_info":false}', '{"log_warning":false}', '{"log_error":false}'],
                                   (1, 0))):
        s = qa.start(d, args, f"logging.{sub}.server.log")
        for body in settings if s else ():
            code, text = _curl(body, "http://localhost:8000/v2/logging")
            qa.check(f"logging {sub}: POST /v2/logging {body}", code == 200, text)
        _pytest(qa, d, "logging_test.py", s, variant=sub)
        if s is None:
            continue
        _stop(qa, s, f"logging {sub}")
        for msg in ("Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!", "Verbose Msg!"):
            want = counts[1] if msg == "Verbose Msg!" else counts[0]
            n = _log_count(s, msg)
            qa.check(f"logging {sub}: '{msg}' logged {want} times", n == want, f"logged {n} times")


def _custom_metrics(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "custom_metrics")
    s = qa.start(d, _args(models), "custom_metrics.server.log")
    _pytest(qa, d, "../test_infer_shm_leak.py", s, env={"MODEL_NAME": "custom_metrics"}, variant="custom_metrics")
    _stop(qa, s, "custom_metrics")


def _parameters(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for n in ("response_parameters", "response_parameters_decoupled", "response_parameters_bls"):
        _model(qa, models, n)
    s = qa.start(d, _args(models), "response_parameters_test.server.log")
    _pytest(qa, d, "response_parameters_test.py", s)
    _stop(qa, s, "parameters")


def _model_control(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "identity_fp32")
    _model(qa, models, "simple_identity_fp32", files=())
    s = qa.start(d, _args(models, "--model-control-mode=explicit"), "model_control.server.log")
    _pytest(qa, d, "model_control_test.py", s)
    _pytest(qa, d, "model_control_test.py::ModelIDValidationTest", s, variant="model_id_validation")
    _stop(qa, s, "model_control")


def _request_rescheduling(qa, d: Path) -> None:
    models = _fresh(d / "models")
    for n in ("bls_request_rescheduling", "request_rescheduling_addsub", "iterative_sequence", "wrong_return_type"):
        _model(qa, models, n)
    s = qa.start(d, _args(models, "--model-control-mode=explicit --load-model=*"), "request_rescheduling.server.log")
    _pytest(qa, d, "../test_infer_shm_leak.py", s, env={"MODEL_NAME": "bls_request_rescheduling"},
            variant="bls_request_rescheduling")
    _pytest(qa, d, "grpc_endpoint_test.py", s)
    _stop(qa, s, "request_rescheduling")


def _model_readiness(qa, d: Path) -> None:
    models = _fresh(d / "models")
    _model(qa, models, "identity_fp32")
    for sig in (signal.SIGSEGV, signal.SIGKILL):
        s = qa.start(d, _args(models), f"model_readiness_signal_{int(sig)}.server.log")
        qa.unittest(d, "test_model_readiness.py", ["TestModelReadiness.test_model_ready"], variant=f"signal {int(sig)}",
                    env=_env(qa), server=s)
        if s is None:
            continue
        stubs = _workers(s, "identity_fp32")
        qa.check(f"signal {int(sig)}: the model's worker is found", bool(stubs), "no worker process")
        for pid in stubs:
            os.kill(pid, sig)
        time.sleep(1)
        _skip(qa, "test_model_readiness.py", f"TestModelReadiness.test_model_not_ready[signal {int(sig)}]", RESTARTED)
        _skip(qa, "test.sh", f"signal {int(sig)}: 'not ready: Stub process ... is not healthy' logged twice", RESTARTED)
        qa.unittest(d, "test_model_readiness.py", ["TestModelReadiness.test_model_ready"],
                    variant=f"signal {int(sig)}, restarted", env=_env(qa), server=s)
        _stop(qa, s, f"model_readiness signal {int(sig)}")

    for name, value, delay in (("is_ready_fn_returns_true", "true", "0.1"), ("is_ready_fn_returns_false", "false", "0.1"),
                               ("is_ready_fn_raises_error", "exception", "0.1"),
                               ("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
                               ("is_ready_fn_timeout", "true", "8"),
                               ("is_ready_fn_coroutine_returns_true", "coroutine", "0.1")):
        (models / name / "1").mkdir(parents=True)
        src = "readiness_coroutine_model.py" if name == "is_ready_fn_coroutine_returns_true" else "readiness_model.py"
        shutil.copy(d / "test_models" / src, models / name / "1" / "model.py")
        shutil.copy(models / "identity_fp32" / "config.pbtxt", models / name)
        _sed(models / name / "config.pbtxt", r"(?m)^name:.*", f'name: "{name}"')
        _append(models / name / "config.pbtxt",
                f'parameters: {{\n  key: "READINESS_FN_RETURN_VALUE"\n  value: {{ string_value: "{value}" }}\n}}\n'
                f'parameters: {{\n  key: "READINESS_FN_DELAY_SECS"\n  value: {{ string_value: "{delay}" }}\n}}')
    _copytree(d / "test_models" / "is_ready_fn_returns_true_decoupled", models / "is_ready_fn_returns_true_decoupled")
    dec = models / "is_ready_fn_returns_true_decoupled"
    (dec / "1").mkdir(exist_ok=True)
    shutil.move(dec / "model.py", dec / "1" / "model.py")
    s = qa.start(d, _args(models, "--strict-readiness=false"), "user_defined_readiness.server.log")
    qa.unittest(d, "test_model_readiness.py", ["TestUserDefinedModelReadinessFunction"], env=_env(qa), server=s)
    _stop(qa, s, "model_readiness user-defined")


def _examples(qa, d: Path) -> None:
    pb = _python_backend(qa)
    if pb is None:
        _skip(qa, "test.sh", "examples", "needs QA_PYTHON_BACKEND (the python_backend repository's examples)")
        return
    ex = pb / "examples"
    cases = [("add_sub", "add_sub", "model.py", "config.pbtxt", "client.py"),
             ("pytorch", "pytorch", "model.py", "config.pbtxt", "client.py"),
             ("bls_sync", "bls", "sync_model.py", "sync_config.pbtxt", "sync_client.py"),
             ("repeat_int32", "decoupled", "repeat_model.py", "repeat_config.pbtxt", "repeat_client.py"),
             ("square_int32", "decoupled", "square_model.py", "square_config.pbtxt", "square_client.py"),
             ("bls_async", "bls", "async_model.py", "async_config.pbtxt", "async_client.py")]
    for name, folder, model, config, client in cases:
        models = _fresh(d / "models")
        (models / name / "1").mkdir(parents=True)
        shutil.copy(ex / folder / model, models / name / "1" / "model.py")
        shutil.copy(ex / folder / config, models / name / "config.pbtxt")
        if name.startswith("bls"):
            for dep in ("add_sub", "pytorch"):
                (models / dep / "1").mkdir(parents=True)
                shutil.copy(ex / dep / "model.py", models / dep / "1")
                shutil.copy(ex / dep / "config.pbtxt", models / dep)
        s = qa.start(d, _args(models), f"examples_{name}.server.log")
        if s is None:
            qa.check(f"examples {name}: server starts", False, qa.last_start_error)
            continue
        run = subprocess.run([sys.executable, str(ex / folder / client)], cwd=pb, capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, **_env(qa)))
        qa.check(f"examples {folder}/{client}", run.returncode == 0 and "PASS" in run.stdout,
                 (run.stdout + run.stderr)[-600:])
        _stop(qa, s, f"examples {name}")


def _python_based_backends(qa, d: Path) -> None:
    """test.sh's repository; the add_sub backend goes to a backend directory of the suite's own
    (test.sh writes it into Triton's, /opt/tritonserver/backends)."""
    backends = _fresh(d / "backends")
    (backends / "add_sub").mkdir()
    shutil.copy(qa.qa / "python_models" / "python_based_backends" / "add_sub_backend" / "model.py",
                backends / "add_sub")
    models = _fresh(d / "models")
    for name, versions in (("add", ("1", "2")), ("sub", ("1",))):
        for version in versions:
            (models / name / version).mkdir(parents=True)
            (models / name / version / "model.json").write_text(f'{{ "operation": "{name}" }}\n')
        (models / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    _model(qa, models, "add_sub", keep_name=True)
    _copytree(models / "add_sub" / "1", models / "add_sub" / "2")
    gen = subprocess.run([sys.executable, str(qa.qa / "common" / "gen_qa_pytorch_model.py"), "-m", str(models)],
                         capture_output=True, text=True, timeout=300)
    qa.check("gen_qa_pytorch_model.py", gen.returncode == 0, (gen.stdout + gen.stderr)[-600:])
    s = qa.start(d, f"--model-repository={models} --backend-directory={backends} --model-control-mode=explicit "
                    f"--log-verbose=1", "python_based_backends.server.log")
    _pytest(qa, d, "python_based_backends_test.py", s)
    _stop(qa, s, "python_based_backends")


RUNNERS = {"main": _main, "ensemble": _ensemble, "bls": _bls, "decoupled": _decoupled,
           "response_sender": _response_sender, "io": _io, "async_execute": _async_execute, "lifecycle": _lifecycle,
           "argument_validation": _argument_validation, "logging": _logging, "custom_metrics": _custom_metrics,
           "parameters": _parameters, "model_control": _model_control, "request_rescheduling": _request_rescheduling,
           "model_readiness": _model_readiness, "examples": _examples,
           "python_based_backends": _python_based_backends}


def l0_backend_python(qa) -> None:
    root = qa.qa / "L0_backend_python"
    for name, why in NOT_RUN.items():
        print(f"  (not run: {name}: {why})", flush=True)
    wanted = os.environ.get("QA_PYTHON_SUBTESTS", "").split() or list(SUBTESTS)
    base = qa.suite
    for name in wanted:
        qa.suite = f"{base}.{name}"
        print(f"\n  ### {qa.suite}", flush=True)
        RUNNERS[name](qa, root if name == "main" else root / name)
    qa.suite = base
