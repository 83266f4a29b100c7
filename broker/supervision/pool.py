"""Model instances and the worker processes that fill them: spawn with an argv list, watch
through pidfds, restart with backoff.

The broker owns this pool, so it learns of a death the moment the pidfd turns readable,
without signal handlers or polling threads. `WorkerProcesses` is the only place that touches
processes; an in-process harness replaces it to drive the broker without any.

Crash-loop policy: each death of a worker that never completed a batch counts; a worker
generation that completed one clears the count (it was serving, so the next death is not
part of a loop). More than CRASH_LIMIT counted deaths inside CRASH_WINDOW seconds (a
CrashWindow: the supervisor's rule for the broker too) mark the instance FAILED instead of
restarting it forever. Backoff doubles with the count.
"""
from __future__ import annotations

import enum
import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import msgspec

from tritond.crash_window import CrashWindow
from tritond.process import EXIT_NO_MEMORY
from tritond.repository.threads import thread_env
from tritond.wire.schema import WorkerSpec

from tritond.broker.supervision.templates import Templates

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

_S = InstanceState
# Every change of an instance's state goes through `Instance.move_to`, which allows only these
# (staying in the same state is always allowed). A worker that is gone (STOPPED, FAILED) or on
# its way out (KILLED, STOPPING) never serves again: only a new generation (STARTING) does.
TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    _S.STARTING: frozenset({_S.READY, _S.KILLED, _S.RESTARTING, _S.FAILED, _S.STOPPING, _S.STOPPED}),
    _S.READY: frozenset({_S.BUSY, _S.KILLED, _S.RESTARTING, _S.FAILED, _S.STOPPING, _S.STOPPED}),
    _S.BUSY: frozenset({_S.READY, _S.KILLED, _S.RESTARTING, _S.FAILED, _S.STOPPING, _S.STOPPED}),
    _S.KILLED: frozenset({_S.RESTARTING, _S.FAILED, _S.STOPPING, _S.STOPPED}),
    _S.RESTARTING: frozenset({_S.STARTING, _S.FAILED, _S.STOPPED}),
    _S.FAILED: frozenset({_S.STOPPING, _S.STOPPED}),
    _S.STOPPING: frozenset({_S.KILLED, _S.FAILED, _S.STOPPED}),
    _S.STOPPED: frozenset({_S.STOPPING}),
}


class IllegalTransition(RuntimeError):
    """A state change the instance's life does not allow: a bug in the broker, refused."""


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
    leaving: bool = False          # a load removed it from its version: it takes no more work
    generation: int = 0
    pid: int = 0
    pidfd: int = -1
    _state: InstanceState = field(default=InstanceState.STARTING, repr=False)
    batch: int | None = None       # the in-flight batch id, if any
    served: bool = False           # this generation completed a batch
    ready_hook: bool = False       # its model defines is_ready() (said by its worker at start-up)
    exit_reason: str = ""          # why this generation is expected to end (killed, failed to load)
    batch_started: float = 0.0
    batch_padding: int = 0         # the in-flight sequence batch's padding slots (counted in its size)
    extensions: int = 0            # serial runs sent behind its in-flight one, under the same batch id
    last_heartbeat: float = 0.0
    crashes: CrashWindow = field(default_factory=lambda: CrashWindow(CRASH_LIMIT, CRASH_WINDOW))
    restarts: int = 0
    restart_at: float = 0.0
    last_error: str = ""
    idle_since: float = 0.0

    @property
    def state(self) -> InstanceState:
        return self._state

    def move_to(self, state: InstanceState) -> None:
        """The one way to change the state (TRANSITIONS); raises IllegalTransition."""
        if state is not self._state and state not in TRANSITIONS[self._state]:
            raise IllegalTransition(f"instance '{self.name}' cannot go from {self._state.value} to {state.value}")
        self._state = state

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
        inst.crashes.clear()
    if not inst.crashes.record(now):
        return False
    delay = min(BACKOFF_MAX, BACKOFF_MIN * (2 ** (len(inst.crashes) - 1)))
    inst.restart_at = now + delay
    return True


class WorkerProcesses:
    """Starts, signals and reaps worker processes: forked from a warm template when one
    serves the model (broker/supervision/templates.py), else spawned with an argv list (never a shell).
    A forked worker is re-parented to the broker (a child subreaper), so both kinds are the
    broker's children, watched through pidfds and reaped alike. Every process started here
    stays listed until it is reaped: none can be forgotten alive.

    Generations are unique across the broker, not per slot, so a model unloaded and loaded
    again never reuses the identity of a worker that may still be exiting."""

    def __init__(self, templates: Templates | None = None) -> None:
        self._generations = itertools.count(1)
        self._procs: dict[int, subprocess.Popen | None] = {}   # pid -> spawned process (None: forked)
        self.others: set[int] = set()      # children started elsewhere in the broker (other brokers)
        self.templates = templates or Templates(enabled=False)

    def next_generation(self) -> int:
        return next(self._generations)

    def spawn(self, inst: Instance, spec: WorkerSpec, env: dict[str, str] | None) -> None:
        """Start the process of `inst`'s current generation."""
        pid = self.templates.fork(spec) if env is None else None
        if pid is not None:
            self._procs[pid] = None
        else:
            argv = [sys.executable, "-m", "tritond.workers.main", msgspec.json.encode(spec).decode()]
            if spec.threads:    # its BLAS and OpenMP runtimes start at the size of its thread budget
                env = {**(env if env is not None else os.environ), **thread_env(spec.threads)}
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})   # workers ignore SIGHUP
            try:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, close_fds=True)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            pid = proc.pid
            self._procs[pid] = proc
        inst.pid = pid
        inst.pidfd = os.pidfd_open(pid)

    def forked(self, inst: Instance) -> bool:
        return inst.pid in self._procs and self._procs[inst.pid] is None

    def alive(self, inst: Instance) -> bool:
        if inst.pid not in self._procs:
            return False
        proc = self._procs[inst.pid]
        if proc is not None:
            return proc.poll() is None
        try:        # look without reaping: the pidfd's owner reaps it
            return os.waitid(os.P_PID, inst.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def kill(self, inst: Instance, sig: int = signal.SIGKILL) -> None:
        if self.alive(inst):
            try:
                os.kill(inst.pid, sig)
            except ProcessLookupError:
                pass

    def reap(self, inst: Instance) -> int:
        """Collect the exit status of a dead worker and close its pidfd."""
        proc = self._procs.pop(inst.pid)
        if proc is not None:
            rc = proc.wait()
        else:
            _, status = os.waitpid(inst.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
        if inst.pidfd >= 0:
            os.close(inst.pidfd)
            inst.pidfd = -1
        return rc

    def wait(self, inst: Instance, timeout: float) -> bool:
        """Wait up to `timeout` for the process to end; True when it has."""
        deadline = time.monotonic() + max(0.0, timeout)
        while self.alive(inst):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def reap_strays(self) -> list[int]:
        """Reap exited children the broker never started: descendants of workers that were
        orphaned and re-parented to the broker (it is a subreaper). Returns their pids."""
        known = set(self._procs) | self.templates.pids() | self.others
        reaped = []
        for pid in _children(os.getpid()) - known:
            try:
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    os.waitpid(pid, 0)
                    reaped.append(pid)
            except ChildProcessError:
                pass
        return reaped

    def unlisted(self) -> set[int]:
        """Children of the broker that are not workers: templates, their spares, strays."""
        return _children(os.getpid()) - set(self._procs)

    def close(self) -> None:
        self.templates.close()


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
        except OSError:
            continue
    return out
