"""Signal installation. Handlers only count (DESIGN §6); the loop acts on the counts, woken
by the wakeup pipe. Installed by `Supervisor.start`, never by its constructor, so a test can
build one and call `caught` instead of sending a signal.

SIGTERM/SIGINT: drain and stop. SIGHUP: forwarded to every child. SIGUSR1: reopen the log."""
from __future__ import annotations

import os
import signal
from types import FrameType


class Signals:
    def __init__(self) -> None:
        self.stop = 0            # the first SIGTERM/SIGINT caught (0: none)
        self.hangups = 0         # SIGHUPs not yet forwarded
        self.reopens = 0         # SIGUSR1s not yet acted on
        self.fd = -1             # the wakeup pipe's read end, once installed

    def install(self) -> None:
        self.fd, wakeup = os.pipe()
        os.set_blocking(wakeup, False)
        signal.set_wakeup_fd(wakeup)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, self.caught)

    def caught(self, signum: int, _frame: FrameType | None = None) -> None:
        if signum == signal.SIGHUP:
            self.hangups += 1
        elif signum == signal.SIGUSR1:
            self.reopens += 1
        else:
            self.stop = self.stop or signum

    def clear_wakeup(self) -> None:
        """Empty the wakeup pipe, so that it wakes the loop only for new signals."""
        os.read(self.fd, 64)
