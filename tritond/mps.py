"""NVIDIA MPS for GPU workers: one private control daemon per server (`tritond start --mps`).

Without MPS, the CUDA contexts of several worker processes on one GPU time-slice; under
MPS their kernels run concurrently on one shared context. The daemon gets pipe and log
directories inside the server's private run directory, so it never meets a system-wide
MPS daemon or another server's. GPU workers find it through the same two variables in
their environment, and may be limited to a share of the GPU's SMs with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (server-wide from --mps-active-thread-percentage, per
model from the config parameter `mps_active_thread_percentage`). The daemon is quit with
`echo quit | nvidia-cuda-mps-control` when the server stops.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time

from tritond.repository.devices import gpu_count
from tritond.wire.options import ServerOptions

log = logging.getLogger("tritond.mps")

CONTROL = "nvidia-cuda-mps-control"
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VAR = "CUDA_MPS_LOG_DIRECTORY"
PERCENTAGE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PERCENTAGE_PARAMETER = "mps_active_thread_percentage"
QUIT_TIMEOUT_S = 10.0


class MpsError(Exception):
    pass


def parse_percentage(value: str | int, what: str = "the MPS active thread percentage") -> int:
    """An integer percentage of a GPU's SMs, 1..100."""
    try:
        pct = int(str(value).strip())
    except ValueError:
        pct = 0
    if not 1 <= pct <= 100:
        raise ValueError(f"{what} must be an integer from 1 to 100, got '{value}'")
    return pct


class MpsDaemon:
    """The control daemon of one server, with its private directories under `run_dir`."""

    def __init__(self, run_dir: str, percentage: int | None = None, executable: str | None = None) -> None:
        self.pipe_dir = os.path.join(run_dir, "mps", "pipe")
        self.log_dir = os.path.join(run_dir, "mps", "log")
        self.percentage = percentage
        self.executable = executable
        self.started = False

    def worker_env(self) -> dict[str, str]:
        """What a GPU worker needs in its environment to become a client of this daemon."""
        env = {PIPE_VAR: self.pipe_dir, LOG_VAR: self.log_dir}
        if self.percentage is not None:
            env[PERCENTAGE_VAR] = str(self.percentage)
        return env

    def control_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update({PIPE_VAR: self.pipe_dir, LOG_VAR: self.log_dir})
        return env

    def start_command(self) -> list[str]:
        return [self.executable or CONTROL, "-d"]

    def quit_command(self) -> tuple[list[str], str]:
        """argv and stdin that ask the daemon to quit."""
        return [self.executable or CONTROL], "quit\n"

    def check_host(self) -> None:
        """Raise MpsError unless this host can run MPS: the control binary and a GPU."""
        exe = self.executable or shutil.which(CONTROL)
        if exe is None:
            raise MpsError(f"--mps: {CONTROL} was not found on PATH; MPS needs the NVIDIA driver's "
                           "utilities and a GPU")
        if gpu_count() == 0:
            raise MpsError("--mps: no GPU is visible (nvidia-smi lists none), so there is nothing to share")
        self.executable = exe

    def start(self) -> None:
        """Start the daemon (a no-op when already started); MpsError when it cannot run."""
        if self.started:
            return
        self.check_host()
        for d in (self.pipe_dir, self.log_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        try:
            done = subprocess.run(self.start_command(), env=self.control_env(), capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            raise MpsError(f"--mps: could not run {CONTROL}: {e}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
            raise MpsError(f"--mps: {CONTROL} -d failed: {detail}")
        self.started = True
        log.info("MPS control daemon started (pipe directory %s)", self.pipe_dir)

    def stop(self) -> None:
        """Quit the daemon and wait for its control pipe to go away; never raises."""
        if not self.started:
            return
        self.started = False
        argv, stdin = self.quit_command()
        try:
            subprocess.run(argv, input=stdin, env=self.control_env(), capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            log.error("could not stop the MPS control daemon: %s", e)
            return
        control = os.path.join(self.pipe_dir, "control")
        deadline = time.monotonic() + QUIT_TIMEOUT_S
        while os.path.exists(control) and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("MPS control daemon stopped")


def from_options(opts: ServerOptions, run_dir: str) -> MpsDaemon | None:
    """The daemon a server asked for with --mps, else None."""
    if not opts.mps:
        return None
    return MpsDaemon(run_dir, opts.mps_active_thread_percentage)
