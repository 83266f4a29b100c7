"""Real Triton for same-run baselines: the tritonserver of a folder that
../shared/bench-anchors/run_anchors.sh prepared (its Python backend and the Triton venv first on
the paths, as run_anchors.sh starts it), serving any model repository on free loopback ports.

  ANCHORS_DIR=/tmp/anchors SKIP_PA=1 SKIP_LOADGEN=1 bash ../shared/bench-anchors/run_anchors.sh
"""
from __future__ import annotations

import glob
import os
import subprocess
import time
from pathlib import Path

from bench_core import STOP_TIMEOUT_S, ServerStartError, free_port, is_ready


def anchors_ready(anchors: Path) -> bool:
    return (anchors / "triton_dist" / "bin" / "tritonserver").exists() and (anchors / "triton-venv").is_dir()


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
