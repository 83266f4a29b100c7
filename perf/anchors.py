"""Real Triton for same-run baselines: the tritonserver of a folder that
../shared/bench-anchors/run_anchors.sh prepared (its Python backend and the Triton venv first on
the paths, as run_anchors.sh starts it), serving any model repository on free loopback ports.

  ANCHORS_DIR=/tmp/anchors SKIP_PA=1 SKIP_LOADGEN=1 bash ../shared/bench-anchors/run_anchors.sh

`prepare` makes the Triton half of such a folder (the Triton venv with run_anchors.sh's pins,
then triton_dist) without MLServer or perf_analyzer.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_core import ROOT, STOP_TIMEOUT_S, ServerStartError, free_port, is_ready

HARNESS = ROOT.parent / "shared" / "bench-anchors" / "run_anchors.sh"
# run_anchors.sh's setup(): the Triton venv's packages, by the names of its version variables
TRITON_VENV_PINS = (("nvidia-pytriton", "PYTRITON_VER"), ("tritonclient[all]", "TRITONCLIENT_VER"),
                    ("onnxruntime", "ORT_VER"), ("uvloop", "UVLOOP_VER"), ("numpy", "NUMPY_TRITON_VER"))


class AnchorsError(RuntimeError):
    """The Triton folder could not be prepared; the message says why and what to do."""


def anchors_ready(anchors: Path) -> bool:
    return (anchors / "triton_dist" / "bin" / "tritonserver").exists() and (anchors / "triton-venv").is_dir()


def harness_pins(text: str) -> list[str]:
    """pip requirements of run_anchors.sh's Triton venv, read from the script's text."""
    versions = dict(re.findall(r"^([A-Z_]+_VER)=(\S+)", text, re.M))
    missing = [var for _, var in TRITON_VENV_PINS if var not in versions]
    if missing:
        raise AnchorsError(f"run_anchors.sh no longer sets {', '.join(missing)}")
    return [f"{name}=={versions[var]}" for name, var in TRITON_VENV_PINS]


def prepare(anchors: Path, python: str = "python3.11", harness: Path = HARNESS) -> None:
    """Make anchors/triton-venv and anchors/triton_dist as run_anchors.sh's setup() and
    prepare_triton_dist() do (same pins, same layout), reusing whatever is already there."""
    def step(argv: list[str], what: str) -> None:
        print(f"[anchors] {what}", file=sys.stderr)
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise AnchorsError(f"{what} failed (exit {done.returncode}):\n{tail}")

    if not harness.is_file():
        raise AnchorsError(f"no bench-anchors harness at {harness}")
    venv = anchors / "triton-venv"
    if not (venv / "bin" / "python").exists():
        if shutil.which(python) is None:
            raise AnchorsError(f"{python} not found (the Python-backend stub is chosen for the venv's version)")
        anchors.mkdir(parents=True, exist_ok=True)
        step([python, "-m", "venv", str(venv)], f"creating {venv}")
    if not glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "pytriton" / "tritonserver")):
        pins = harness_pins(harness.read_text())
        step([str(venv / "bin" / "pip"), "install", "-q", "-U", "pip"], "upgrading pip")
        step([str(venv / "bin" / "pip"), "install", "-q", *pins], f"installing {' '.join(pins)}")
    dist = anchors / "triton_dist"
    if not (dist / "backends" / "python" / "triton_python_backend_stub").exists():
        site = Path(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])
        pyver = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                               capture_output=True, text=True, check=True).stdout.strip()
        stub = site / "pytriton" / "tritonserver" / "python_backend_stubs" / pyver / "triton_python_backend_stub"
        if not stub.exists():
            raise AnchorsError(f"the nvidia-pytriton wheel has no Python-backend stub for Python {pyver}")
        print(f"[anchors] preparing {dist}", file=sys.stderr)
        staging = anchors / "triton_dist.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(site / "pytriton" / "tritonserver", staging, symlinks=True)
        shutil.rmtree(staging / "python_backend_stubs")
        shutil.copy2(stub, staging / "backends" / "python")
        staging.rename(dist)


class Triton:
    def __init__(self, anchors: Path, repository: Path, log_path: Path, extra: list[str] | None = None) -> None:
        venv = anchors / "triton-venv"
        site = Path(glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0])
        libdir = subprocess.run([str(venv / "bin" / "python"), "-c",
                                 "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
        env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}", ORT_THREADS="1",
                   LD_LIBRARY_PATH=":".join(filter(None, [str(site / "nvidia_pytriton.libs"), libdir,
                                                          os.environ.get("LD_LIBRARY_PATH")])))
        dist = anchors / "triton_dist"
        self.http, self.grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        argv = [str(dist / "bin" / "tritonserver"), f"--model-repository={repository}",
                f"--backend-directory={dist / 'backends'}", f"--cache-directory={dist / 'caches'}",
                "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                f"--http-port={self.http.rsplit(':', 1)[1]}", f"--grpc-port={self.grpc.rsplit(':', 1)[1]}",
                f"--metrics-port={free_port()}", "--exit-timeout-secs=10", *(extra or [])]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not is_ready(self.http):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
                raise ServerStartError(f"tritonserver did not become ready:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
