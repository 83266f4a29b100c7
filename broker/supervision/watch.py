"""Watching workers: what happens when one exits, and which ones to kill or restart.

Failure is detected three ways (DESIGN §6): the pidfd turns readable (exit), heartbeats stop
(hang), a batch overruns the model's execution deadline. A dead worker's batch is answered
(or retried once for an idempotent model), its shared memory reclaimed, its identity dropped,
and the instance restarted with backoff unless it is in a crash loop. Every decision takes
`now` from the broker's clock, so it is tested in-process with a fake one.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from tritond.repository.backends import PYTHON
from tritond.shm.naming import owner_prefix, sweep

from tritond.broker.tables.instances import InstanceTable
from tritond.broker.lifecycle.version_state import Lifecycle
from tritond.broker.tables.model_version import LOADING, ModelVersion
from tritond.broker.supervision.pool import CRASH_WINDOW, Instance, InstanceState, WorkerProcesses, describe_exit, record_crash
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.scheduling.path import RequestPath
from tritond.broker.supervision.restart_wait import RestartWait

log = logging.getLogger("tritond.broker")

HEARTBEAT_TIMEOUT_S = 3.0
LOAD_TIMEOUT_S = 300.0
STRAY_CHECK_S = 5.0
INIT_FAILED = "failed to initialize"
_WATCHED = (InstanceState.READY, InstanceState.BUSY, InstanceState.STOPPING)
_EXECUTING = (InstanceState.BUSY, InstanceState.STOPPING)


def judge(inst: Instance, now: float, exec_timeout_s: float, judge_silence: bool) -> str:
    """Why `inst`'s worker must be killed now ('' when it may live). Silence is judged only
    when no worker message waits unread: after a slow loop turn the heartbeats are in the
    socket, not missing."""
    if judge_silence and inst.state in _WATCHED and now - inst.last_heartbeat > HEARTBEAT_TIMEOUT_S:
        return f"was killed after it sent no heartbeat for {HEARTBEAT_TIMEOUT_S:g} s (hung or stopped)"
    if inst.state in _EXECUTING and inst.batch is not None and now - inst.batch_started > exec_timeout_s:
        return f"was killed after it exceeded the execution timeout of {exec_timeout_s:g} s"
    if inst.state is InstanceState.STARTING and now - inst.batch_started > LOAD_TIMEOUT_S:
        return f"was killed after it did not finish loading within {LOAD_TIMEOUT_S:g} s"
    return ""


class Supervision:
    def __init__(self, server_id: str, registry: ModelRegistry, instances: InstanceTable,
                 pool: WorkerProcesses, lifecycle: Lifecycle, requests: RequestPath,
                 announce_gone: Callable[[str], None], publish: Callable[[], None], restart_wait: RestartWait) -> None:
        self.server_id = server_id
        self.registry = registry
        self.instances = instances
        self.pool = pool
        self.lifecycle = lifecycle
        self.requests = requests
        self.restart_wait = restart_wait
        self._announce_gone = announce_gone
        self._publish = publish          # sends the model table now if it changed
        self.shutting_down = False      # no restarts, no retries
        self.next_stray_check = 0.0

    def on_exit(self, inst: Instance, now: float) -> None:
        """A worker process ended: reclaim its shared memory, drop its identity (so late frames
        are ignored), schedule its restart, publish the model's new state, and only then answer
        (or retry) the batch it held: a client told that its request failed finds the model
        not ready already."""
        pid = inst.pid
        mv = self.instances.model_of(inst)
        self.instances.forget(inst)
        rc = self.pool.reap(inst)
        prefix = owner_prefix(self.server_id, inst.owner)
        sweep(prefix)
        self._announce_gone(prefix)
        how = inst.exit_reason or f"died ({describe_exit(rc)})"
        bid, inst.batch = inst.batch, None
        cause = f"instance '{inst.name}' {how}"
        self.requests.lost_instance(mv, inst, how)
        if inst.state in (InstanceState.STOPPING, InstanceState.STOPPED) or self.shutting_down or mv.unloaded:
            inst.move_to(InstanceState.STOPPED)
            self.requests.lost_batch(mv, bid, cause, may_retry=not self.shutting_down)
            return
        inst.last_error = f"instance '{inst.name}' {how}"
        if inst.state is InstanceState.FAILED:
            pass
        elif mv.state == LOADING:
            detail = f"instance '{inst.name}' {how}"
            if mv.view.backend == PYTHON:       # Triton's words for a python stub that died
                detail = f"Stub process '{inst.name}' is not healthy. Its worker process {how}"
            self.lifecycle.fail_load(mv, f"load failed for model '{mv.name}': {detail}")
        else:
            self._after_crash(mv, inst, how, now)
            self.lifecycle.update_state(mv)
        self._publish()
        may_retry = inst.state is InstanceState.RESTARTING or bool(mv.serving())
        failed, retried = self.requests.lost_batch(mv, bid, cause, may_retry=may_retry)
        if bid is not None or not how.startswith(INIT_FAILED):    # a failed load is logged once, as the model's state
            log.error("model '%s' instance '%s' (pid %d) %s; its batch held %d request(s): %d failed, %d retried",
                      mv.name, inst.name, pid, how, failed + retried, failed, retried)
        self.requests.dispatch(mv)

    def _after_crash(self, mv: ModelVersion, inst: Instance, how: str, now: float) -> None:
        if record_crash(inst, now):
            inst.move_to(InstanceState.RESTARTING)
            return
        inst.move_to(InstanceState.FAILED)
        inst.last_error = (f"instance '{inst.name}' failed {len(inst.crashes)} times within "
                           f"{CRASH_WINDOW:g} s without serving and is not restarted; last: {how}")
        log.error("model '%s' %s", mv.name, inst.last_error)

    def expire_restart_wait(self, mv: ModelVersion) -> None:
        """Fail what waits for a restart that is taking too long (restart_wait.py)."""
        err = self.restart_wait.overdue(mv)
        if err is not None:
            self.requests.fail_queued(mv, err)

    def on_load_failed(self, mv: ModelVersion, inst: Instance, reason: str) -> None:
        """The worker said its model failed to initialize; it exits on its own."""
        inst.exit_reason = f"{INIT_FAILED}: {reason}"
        if mv.state == LOADING:
            self.lifecycle.fail_load(mv, f"load failed for model '{mv.name}': {reason}")

    def next_restart(self) -> float:
        """When the earliest instance waiting out its backoff may restart (inf: none waits)."""
        return min((i.restart_at for mv in self.registry.all_versions() for i in mv.instances
                    if i.state is InstanceState.RESTARTING), default=float("inf"))

    def check(self, now: float, judge_silence: bool) -> None:
        """Restart instances whose backoff ended; kill hung, overrunning or stuck workers
        (the pidfd then reports the death and `on_exit` takes over); reap orphans of workers
        that were re-parented to the broker."""
        if now >= self.next_stray_check:
            self.next_stray_check = now + STRAY_CHECK_S
            for pid in self.pool.reap_strays():
                log.info("reaped process %d, an orphan of a worker or of another broker", pid)
                sweep(owner_prefix(self.server_id, f"w{pid}"))      # a worker of a broker that died
        for mv in list(self.registry.all_versions()):
            for inst in mv.instances:
                if inst.state is InstanceState.RESTARTING:
                    if now >= inst.restart_at and not self.shutting_down and not mv.unloaded:
                        inst.restarts += 1
                        mv.stats.restarts += 1
                        self.lifecycle.start_instance(mv, inst)
                    continue
                reason = judge(inst, now, mv.view.exec_timeout_s, judge_silence)
                if reason:
                    inst.move_to(InstanceState.KILLED)
                    inst.exit_reason = reason
                    self.pool.kill(inst)
