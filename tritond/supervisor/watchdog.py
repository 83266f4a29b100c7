"""Hang watchdog: the broker pings twice a second, so silence is how a stuck one shows. One
silent for BROKER_SILENCE_S is not healthy (the frontends fail its requests too, and systemd's
watchdog is no longer petted); one silent for `--broker-hang-timeout-secs` is hung: it is
killed, and its pidfd then reports the death, so it is restarted like any dead broker. A
broker still loading its startup models cannot ping: alive is all that is known of it."""
from __future__ import annotations

import logging
import signal

from tritond.frontend.broker_client import BROKER_SILENCE_S
from tritond.notify import Notifier

from .children import Child, ChildProcesses
from .clock import Clock

log = logging.getLogger("tritond")


class BrokerWatchdog:
    def __init__(self, broker: Child, children: ChildProcesses, clock: Clock, notify: Notifier,
                 hang_timeout_s: float) -> None:
        self.broker = broker
        self.children = children
        self.clock = clock
        self.notify = notify
        self.hang_timeout_s = hang_timeout_s
        self.started = False       # the running broker has finished startup, so it pings
        self.last_heard = 0.0
        self.next_pet = 0.0

    def heard(self) -> None:
        self.last_heard = self.clock.now()

    def silence(self) -> float:
        """Seconds since the running broker last spoke; 0 while it starts."""
        return self.clock.now() - self.last_heard if self.started else 0.0

    def healthy(self) -> bool:
        return self.children.running(self.broker) and self.silence() < BROKER_SILENCE_S

    def check(self) -> None:
        """Kill the broker once it is hung (once: its death is on its way)."""
        silence = self.silence()
        if silence < self.hang_timeout_s or self.broker.hung or not self.children.running(self.broker):
            return
        log.error("the broker (pid %d) sent nothing for %.1fs: it is hung; killing it", self.broker.pid, silence)
        self.notify.status("the broker is hung; restarting it")
        self.broker.hung = True
        self.children.signal(self.broker, signal.SIGKILL)

    def pet(self) -> None:
        """WATCHDOG=1 every half WatchdogSec, and only while the broker is healthy: a hung
        server stops petting systemd's watchdog, which then restarts it."""
        if not self.notify.watchdog_s:
            return
        now = self.clock.now()
        if now >= self.next_pet and self.healthy():
            self.notify.watchdog()
            self.next_pet = now + self.notify.watchdog_s

    def timeout(self, timeout_s: float) -> float:
        """`timeout_s`, or less when the next pet is due sooner. A pet that is due but
        withheld (the broker is not healthy) waits for the broker's next message, which ends
        any wait: retrying it at once would spin the loop until the broker is killed as hung."""
        due_in = self.next_pet - self.clock.now()
        return min(timeout_s, due_in) if self.notify.watchdog_s and due_in > 0 else timeout_s
