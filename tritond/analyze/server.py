"""The tritond that `tritond analyze` starts for itself when no `-u` URL is given: explicit
model control on free loopback ports, logs to a file, stopped (SIGTERM, then SIGKILL) at the
end; and the memory its model's worker processes use."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


class ServerError(RuntimeError):
    """The server did not start (the message carries the end of its log)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`tritond start --model-control-mode=explicit --load-model=MODEL` in its own session."""

    def __init__(self, repository: Path, model: str, log_path: Path, shared_memory: bool = False) -> None:
        self.repository, self.model, self.log_path = repository, model, log_path
        self.shared_memory = shared_memory
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def start(self) -> "LocalServer":
        cmd = [sys.executable, "-m", "tritond.cli", "start", "--model-repository", str(self.repository),
               "--model-control-mode=explicit", f"--load-model={self.model}",
               "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
               "--metrics-port", str(self.metrics_port), "--allow-metrics=false",
               f"--allow-client-shm={'true' if self.shared_memory else 'false'}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"tritond exited with {self.proc.returncode} during startup:\n{self._log_tail()}")
            if self._ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"tritond did not become ready within {READY_TIMEOUT_S:g} s:\n{self._log_tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Graceful stop; the supervisor removes its shared memory on the way out."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def worker_pids(self) -> list[int]:
        """This server's worker processes for the model (read from their process title,
        `tritond-worker server=... model=<name> ...`)."""
        if self.proc is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.getsid(int(entry)) != self.proc.pid:
                    continue
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except (OSError, ProcessLookupError):
                continue
            words = b" ".join(argv).decode(errors="replace").split()
            if words[:1] == ["tritond-worker"] and f"model={self.model}" in words:
                out.append(int(entry))
        return out

    def model_memory_mb(self) -> float | None:
        """Proportional set size of the model's workers, in MB (shared pages split between them)."""
        total_kb, found = 0, False
        for pid in self.worker_pids():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total_kb += int(line.split()[1])
                        found = True
                        break
            except OSError:
                continue
        return total_kb / 1024 if found else None
