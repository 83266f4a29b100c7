"""Model instances and the worker processes that fill them: spawn with an argv list, watch
through pidfds, restart with backoff.

The broker owns this pool, so it learns of a death the moment the pidfd turns readable,
without signal handlers or polling threads. `WorkerProcesses` is the only place that touches
processes; an in-process harness replaces it to drive the broker without any.

Crash-loop policy: each death of a worker that never completed a batch counts; a worker
generation that completed one clears the count (it was serving, so the next death is not
part of a loop). More than CRASH_LIMIT counted deaths inside CRASH_WINDOW seconds mark the
instance FAILED instead of restarting it forever. Backoff doubles with the count.
"""
from __future__ import annotations

import enum
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
import msgspec

from tritond.process import EXIT_NO_MEMORY
from tritond.wire.schema import WorkerSpec

BACKOFF_MIN = 0.05
BACKOFF_MAX = 5.0
CRASH_LIMIT = 5
CRASH_WINDOW = 60.0


class InstanceState(enum.Enum):
    STARTING = "STARTING"      # spawned, loading the model
    READY = "READY"            # serving, idle
    BUSY = "BUSY"              # executing a batch
    KILLED = "KILLED"          # killed by the broker (hang, overrun); its exit is awaited
    RESTARTING = "RESTARTING"  # dead, a new generation starts at restart_at
    FAILED = "FAILED"          # not restarted (failed load, crash loop)
    STOPPING = "STOPPING"      # asked to stop (unload, shutdown)
    STOPPED = "STOPPED"


SERVING = (InstanceState.READY, InstanceState.BUSY)


def describe_exit(returncode: int) -> str:
    """'exit code 3', 'killed by signal 9 (SIGKILL)' or 'out of memory'."""
    if returncode == EXIT_NO_MEMORY:
        return "out of memory"
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {sig} ({name})"
    return f"exit code {returncode}"


@dataclass(eq=False)
class Instance:
    """One model instance: a slot that a sequence of worker processes (generations) fills."""
    model: str
    version: int
    index: int
    name: str                      # e.g. "<model>_0_0" (Triton's instance naming)
    kind: str = "CPU"
    device_id: int = 0
    group: int = 0                 # index of its instance group in the config
    generation: int = 0
    pid: int = 0
    pidfd: int = -1
    state: InstanceState = InstanceState.STARTING
    batch: int | None = None       # the in-flight batch id, if any
    served: bool = False           # this generation completed a batch
    exit_reason: str = ""          # why this generation is expected to end (killed, failed to load)
    batch_started: float = 0.0
    last_heartbeat: float = 0.0
    crashes: list[float] = field(default_factory=list)
    restarts: int = 0
    restart_at: float = 0.0
    last_error: str = ""
    idle_since: float = 0.0

    @property
    def identity(self) -> bytes:
        return f"w:{self.model}:{self.version}:{self.index}:{self.generation}".encode()

    @property
    def owner(self) -> str:
        """Segment owner tag: unique per process generation."""
        return f"w{self.pid}"

    @property
    def serving(self) -> bool:
        return self.state in SERVING


def record_crash(inst: Instance, now: float) -> bool:
    """Note a death; True when the instance may restart (at inst.restart_at), False when it
    must be marked failed."""
    if inst.served:
        inst.crashes = []
    inst.crashes = [t for t in inst.crashes if now - t < CRASH_WINDOW] + [now]
    if len(inst.crashes) > CRASH_LIMIT:
        return False
    delay = min(BACKOFF_MAX, BACKOFF_MIN * (2 ** (len(inst.crashes) - 1)))
    inst.restart_at = now + delay
    return True


class WorkerProcesses:
    """Starts, signals and reaps worker processes.

    Generations are unique across the broker, not per slot, so a model unloaded and loaded
    again never reuses the identity of a worker that may still be exiting."""

    def __init__(self) -> None:
        self._generations = itertools.count(1)
        self._procs: dict[int, subprocess.Popen] = {}   # pid -> process

    def next_generation(self) -> int:
        return next(self._generations)

    def spawn(self, inst: Instance, spec: WorkerSpec, env: dict[str, str] | None) -> None:
        """Start the process of `inst`'s current generation (argv list, never a shell)."""
        argv = [sys.executable, "-m", "tritond.workers.main", msgspec.json.encode(spec).decode()]
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})   # workers ignore SIGHUP
        try:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._procs[proc.pid] = proc
        inst.pid = proc.pid
        inst.pidfd = os.pidfd_open(proc.pid)

    def alive(self, inst: Instance) -> bool:
        proc = self._procs.get(inst.pid)
        return proc is not None and proc.poll() is None

    def kill(self, inst: Instance, sig: int = signal.SIGKILL) -> None:
        proc = self._procs.get(inst.pid)
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def reap(self, inst: Instance) -> int:
        """Collect the exit status of a dead worker and close its pidfd."""
        proc = self._procs.pop(inst.pid)
        rc = proc.wait()
        if inst.pidfd >= 0:
            os.close(inst.pidfd)
            inst.pidfd = -1
        return rc

    def wait(self, inst: Instance, timeout: float) -> bool:
        """Wait up to `timeout` for the process to end; True when it has."""
        proc = self._procs.get(inst.pid)
        if proc is None:
            return True
        try:
            proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        return True

    def live(self) -> list[int]:
        return [pid for pid, p in self._procs.items() if p.poll() is None]
