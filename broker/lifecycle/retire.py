"""Model versions on their way out (unloaded, dropped or replaced by a reload): no new request
reaches them, the ones already queued or executing finish, then their workers stop.

Every worker of a retiring version is stopped by message once it is idle, and awaited through
its pidfd like any other, so no process outlives its version unnoticed. The wait is bounded
by --model-unload-timeout-secs: then what is still queued fails with a clear error and busy
workers are killed (their batches fail naming the timeout). An unloaded version that is still
in the table is UNLOADING while it drains and UNAVAILABLE "unloaded" once drained.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from tritond.wire.errors import unavailable

from tritond.broker.clock import Clock
from tritond.broker.tables.model_version import UNAVAILABLE, UNLOADING, ModelVersion
from tritond.broker.supervision.pool import Instance, InstanceState, WorkerProcesses
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.scheduling.path import RequestPath

log = logging.getLogger("tritond.broker")

DEFAULT_TIMEOUT_S = 30.0
_GONE = (InstanceState.STOPPED, InstanceState.FAILED, InstanceState.RESTARTING)
_CAN_SERVE = (InstanceState.STARTING, InstanceState.READY, InstanceState.BUSY)     # a retiring one never restarts


class Retirement:
    def __init__(self, registry: ModelRegistry, requests: RequestPath, pool: WorkerProcesses,
                 send_stop: Callable[[Instance], None], clock: Clock, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_retired: Callable[[ModelVersion], None] = lambda mv: None) -> None:
        self.registry = registry
        self.requests = requests
        self.pool = pool
        self._send_stop = send_stop
        self.clock = clock
        self.timeout_s = timeout_s
        self.on_retired = on_retired

    def retire(self, mv: ModelVersion, unload: bool = False) -> None:
        """Start retiring `mv`; `unload` when it stays in the table (UNLOADING, then unloaded)."""
        if mv.retiring:
            return
        mv.retiring = True
        mv.unloaded = True
        mv.restarting = False
        mv.retire_started = self.clock.now()
        if unload:
            self.registry.set_state(mv, UNLOADING)
            log.info("unloading model '%s' version %d", mv.name, mv.version)
        self.registry.retiring.append(mv)
        self.check(mv, mv.retire_started)

    def tick(self, now: float) -> None:
        for mv in list(self.registry.retiring):
            self.check(mv, now)

    def _drained(self, mv: ModelVersion) -> bool:
        queued = mv.scheduler is not None and len(mv.scheduler) > 0
        return not queued and not any(i.state is InstanceState.BUSY for i in mv.instances)

    def check(self, mv: ModelVersion, now: float) -> None:
        queued = mv.scheduler is not None and len(mv.scheduler) > 0
        if now >= mv.retire_started + self.timeout_s:
            self._expire(mv)
            queued = False
        elif queued and not any(i.state in _CAN_SERVE for i in mv.instances):
            self.requests.fail_queued(mv, unavailable(
                f"model '{mv.name}' version {mv.version} was unloaded and has no instance left to run the request"))
            queued = False
        if not queued:
            for inst in mv.instances:
                if inst.state in (InstanceState.READY, InstanceState.STARTING) and self.pool.alive(inst):
                    inst.move_to(InstanceState.STOPPING)
                    self._send_stop(inst)
                elif inst.state is InstanceState.RESTARTING or (
                        inst.state not in _GONE and not self.pool.alive(inst) and inst.pidfd < 0):
                    inst.move_to(InstanceState.STOPPED)
        if self._drained(mv) and mv.state is UNLOADING:
            self.registry.set_state(mv, UNAVAILABLE, "unloaded")
            log.info("unloaded model '%s' version %d in %.3f s", mv.name, mv.version, now - mv.retire_started)
        if all(i.state in _GONE for i in mv.instances):
            self.registry.retiring.remove(mv)
            if mv.instances:
                log.info("stopped every worker of model '%s' version %d (%.3f s after it left service)",
                         mv.name, mv.version, now - mv.retire_started)
            self.on_retired(mv)

    def _expire(self, mv: ModelVersion) -> None:
        """The unload timeout passed: fail what waits, kill what executes."""
        why = (f"model '{mv.name}' version {mv.version} was unloaded and the unload timeout of "
               f"{self.timeout_s:g} s expired")
        self.requests.fail_queued(mv, unavailable(why))
        for inst in mv.instances:
            if inst.state is InstanceState.BUSY or (inst.state is InstanceState.STOPPING and inst.batch is not None):
                inst.move_to(InstanceState.KILLED)
                inst.exit_reason = f"was stopped: {why}"
                self.pool.kill(inst)
