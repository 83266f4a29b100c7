"""Stopping: SIGTERM/SIGINT drain in-flight work within --exit-timeout-secs before every
process stops; whatever way the server ends, nothing is left behind (processes, segments
carrying this server's id, the run directory)."""
from __future__ import annotations

import logging
import shutil
import signal

from tritond.shm.naming import PREFIX, sweep
from tritond.wire import schema as S

from .exit_codes import ExitCode

log = logging.getLogger("tritond")

FRONTEND_STOP_S = 10.0
BROKER_STOP_S = 10.0


class Stopping:
    """Supervisor's steps that stop the server (core.py holds the parts they use)."""

    def graceful_stop(self) -> ExitCode:
        """Drain in-flight work within --exit-timeout-secs, then stop every process."""
        # tritonserver's words (scripts grep for them), then the exit timeout
        log.info("Waiting for in-flight requests to complete. (exit timeout %gs)", self.opts.exit_timeout_secs)
        self.notify.stopping("draining in-flight requests")
        result = self.control(S.Drain(), self.opts.exit_timeout_secs + 5)
        drained = result is not None and result.drained
        self.stop_all()
        if not drained:
            log.error("exit timeout expired with requests in flight; they were cancelled")
            return ExitCode.CANCELLED
        return ExitCode.CLEAN

    def stop_frontends(self) -> None:
        for f in self.frontends:
            self.children.signal(f, signal.SIGTERM)
        for f in self.frontends:
            self.children.end(f, FRONTEND_STOP_S)

    def stop_broker(self) -> None:
        if not self.children.running(self.broker):
            return
        self.control(S.StopServer(), 2.0)
        self.children.end(self.broker, BROKER_STOP_S)

    def stop_all(self) -> None:
        self.stop_frontends()
        self.stop_broker()

    def cleanup(self) -> None:
        """Idempotent: close sockets, end leftover processes, sweep segments and the run dir."""
        self.link.close()
        self.children.reap_orphans(self.server_id, set())
        if self.mps is not None:
            self.mps.stop()
        for f in self.frontends:
            if f.link is not None:
                f.link.close()
                f.link = None
        self.notify.close()
        sweep(f"{PREFIX}{self.server_id}.")
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
