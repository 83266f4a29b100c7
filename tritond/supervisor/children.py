"""The child-process table: the only place that starts, signals, waits for and reaps the
broker and frontend processes, and finds this server's leftover ones. A unit test replaces
it with records, so the supervisor's decisions run without processes."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .clock import Clock

log = logging.getLogger("tritond")

ORPHAN_GRACE_S = 2.0


@dataclass(eq=False)
class Child:
    """One supervised role (the broker, or one HTTP or gRPC frontend process) across its
    restarts: `pid` and `pidfd` are its current process's."""
    role: str                     # broker | http | grpc
    module: str
    extra: dict[str, Any] = field(default_factory=dict)   # options of this process only
    pid: int = 0
    pidfd: int = -1
    link: socket.socket | None = None     # frontends: the supervisor's end of the readiness pair
    link_state: bytes = b""               # frontends: b"" | LISTENING | SERVING (acknowledged) | CLOSED
    hung: bool = False                    # killed by the supervisor for not answering


def processes_of(server_id: str, exclude: set[int]) -> list[int]:
    """Live tritond processes (`python -m tritond.*` with this server's id in their
    options) other than `exclude`: what must be gone before segments are swept."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if (not zombie and len(argv) >= 4 and argv[1] == b"-m" and argv[2].startswith(b"tritond.")
                and server_id.encode() in argv[3]):
            out.append(int(entry))
    return out


class ChildProcesses:
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self._procs: dict[int, subprocess.Popen] = {}     # pid -> its process, until reaped

    def spawn(self, child: Child, options: str, pass_fds: tuple[int, ...] = ()) -> None:
        """Start `child`'s module with its options. SIGHUP is blocked across the fork (the mask
        survives exec): one that arrives before the child can act on it waits instead of
        killing it."""
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            proc = subprocess.Popen([sys.executable, "-m", child.module, options],
                                    stdin=subprocess.DEVNULL, close_fds=True, pass_fds=pass_fds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._procs[proc.pid] = proc
        child.pid = proc.pid
        child.pidfd = os.pidfd_open(proc.pid)

    def exit_code(self, child: Child) -> int | None:
        """The exit status of `child`'s process once it has ended; None while it runs (and
        once it has been reaped)."""
        proc = self._procs.get(child.pid)
        return None if proc is None else proc.poll()

    def running(self, child: Child) -> bool:
        return child.pid in self._procs and self.exit_code(child) is None

    def signal(self, child: Child, sig: int) -> None:
        if self.running(child):
            self._procs[child.pid].send_signal(sig)

    def wait(self, child: Child, timeout_s: float | None) -> bool:
        """Wait up to `timeout_s` (None: for ever) for the process to end; True when it has."""
        proc = self._procs.get(child.pid)
        try:
            return proc is None or proc.wait(timeout_s) is not None
        except subprocess.TimeoutExpired:
            return False

    def end(self, child: Child, grace_s: float) -> None:
        """Give an exiting process `grace_s` seconds, then kill it; return once it is gone."""
        if not self.wait(child, grace_s):
            self.signal(child, signal.SIGKILL)
            self.wait(child, None)

    def reap(self, child: Child) -> int:
        """The exit status of `child`'s ended process; its pidfd is closed."""
        rc = self._procs.pop(child.pid).wait()
        os.close(child.pidfd)
        child.pidfd = -1
        return rc

    def reap_orphans(self, server_id: str, keep: set[int]) -> None:
        """Wait briefly for processes of this server outside `keep` to go, then kill them."""
        keep = keep | {os.getpid()}
        deadline = self.clock.now() + ORPHAN_GRACE_S
        while (left := processes_of(server_id, keep)) and self.clock.now() < deadline:
            self.clock.sleep(0.05)
        for pid in left:
            log.warning("killing leftover process %d", pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = self.clock.now() + ORPHAN_GRACE_S
        while left and self.clock.now() < deadline:
            self.clock.sleep(0.05)
            left = processes_of(server_id, keep)
