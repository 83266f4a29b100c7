"""Worker processes: spawn with an argv list, watch through pidfds, restart with backoff.

The broker owns this pool, so it learns of a death the moment the pidfd turns readable,
without signal handlers or polling threads.

Crash-loop policy: each death of a worker that never completed a batch counts; a worker
generation that completed one clears the count (it was serving, so the next death is not
part of a loop). More than CRASH_LIMIT counted deaths inside CRASH_WINDOW seconds mark the
instance FAILED instead of restarting it forever. Backoff doubles with the count.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .process import EXIT_NO_MEMORY

BACKOFF_MIN = 0.05
BACKOFF_MAX = 5.0
CRASH_LIMIT = 5
CRASH_WINDOW = 60.0


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


@dataclass
class Instance:
    """One model instance: a slot that a sequence of worker processes (generations) fills."""
    model: str
    version: int
    index: int
    name: str                      # e.g. "<model>_0_0" (Triton's instance naming)
    kind: str = "CPU"
    device_id: int = 0
    generation: int = 0
    proc: subprocess.Popen | None = None
    pidfd: int = -1
    state: str = "STARTING"        # STARTING | READY | BUSY | KILLED | RESTARTING | FAILED | STOPPING | STOPPED
    batch: Any = None              # the in-flight batch, if any
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
        return f"w{self.proc.pid if self.proc else 0}"


_generations = itertools.count(1)


def spawn(inst: Instance, spec: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """Start a worker process for `inst` (argv list, never a shell).

    Generations are unique across the broker, not per slot, so a model unloaded and loaded
    again never reuses the identity of a worker that may still be exiting."""
    inst.generation = next(_generations)
    spec = dict(spec, identity=inst.identity.decode(), broker_pid=os.getpid())
    argv = [sys.executable, "-m", "tritond.workers.main", json.dumps(spec)]
    inst.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, close_fds=True)
    inst.pidfd = os.pidfd_open(inst.proc.pid)
    inst.state = "STARTING"
    inst.last_heartbeat = time.monotonic()
    inst.batch = None
    inst.served = False
    inst.exit_reason = ""


def reap(inst: Instance) -> int:
    """Collect the exit status of a dead worker and close its pidfd."""
    assert inst.proc is not None
    rc = inst.proc.wait()
    if inst.pidfd >= 0:
        os.close(inst.pidfd)
        inst.pidfd = -1
    return rc


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


def kill(inst: Instance, sig: int = signal.SIGKILL) -> None:
    if inst.proc is not None and inst.proc.poll() is None:
        try:
            inst.proc.send_signal(sig)
        except ProcessLookupError:
            pass
