"""Restart policy: a dead broker or frontend is restarted at once, unless that process slot
died more than RESTART_LIMIT times within RESTART_WINDOW_S: then the server gives up and
exits (ExitCode.GAVE_UP), so that whatever manages it can act. So does a broker that cannot
be restarted.

After a child dies its shared-memory segments are swept; after the broker dies, also its
workers' (they die with it by parent-death signal; any that linger are killed first)."""
from __future__ import annotations

import logging

from tritond.crash_window import CrashWindow
from tritond.shm.naming import PREFIX, owner_prefix, sweep

from .children import Child
from .exit_codes import ExitCode
from .startup import Interrupted, StartupError

log = logging.getLogger("tritond")

RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


def restart_window() -> CrashWindow:
    """The deaths of one child (one role's process slot) that count."""
    return CrashWindow(RESTART_LIMIT, RESTART_WINDOW_S)


class Restarts:
    """Supervisor's steps after a child died (core.py holds the parts they use)."""

    def on_child_exit(self, child: Child) -> ExitCode | None:
        """Restart a dead child, or give up when it keeps dying."""
        rc = self.children.reap(child)
        cause = "was killed as hung" if child.hung else "died"
        child.hung = False
        log.error("the %s process (pid %d) %s (%s); restarting it", child.role, child.pid, cause,
                  f"signal {-rc}" if rc < 0 else f"exit code {rc}")
        self.notify.status(f"the {child.role} process {cause}; restarting it")
        deaths = self.deaths[child]
        if not deaths.record(self.clock.now()):
            log.error("the %s process died %d times in %ds; giving up", child.role, len(deaths),
                      int(RESTART_WINDOW_S))
            self.notify.stopping(f"gave up: the {child.role} process kept dying")
            self.stop_all()
            return ExitCode.GAVE_UP
        if child is not self.broker:
            sweep(owner_prefix(self.server_id, f"f{child.pid}"))
            self.spawn(child)
            return None
        self.children.reap_orphans(self.server_id, {f.pid for f in self.frontends if f.pid})
        sweep(f"{PREFIX}{self.server_id}.w")
        sweep(owner_prefix(self.server_id, "b"))        # the response cache's arena
        try:
            self.start_broker()
        except Interrupted:
            log.info("stopping: interrupted while the broker restarted")
            self.stop_all()
            return ExitCode.CLEAN
        except StartupError as e:
            log.error("could not restart the broker: %s", e)
            self.notify.stopping(f"gave up: could not restart the broker: {e}")
            self.stop_all()
            return ExitCode.GAVE_UP
        log.info("the broker is back (pid %d)", self.broker.pid)
        return None
