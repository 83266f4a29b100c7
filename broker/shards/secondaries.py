"""The other brokers of a server started with --broker-shards, as the first broker runs them.

Each schedules its own group of models (repository/partition.py) behind its own sockets;
frontends send each request straight to its model's broker, so no request crosses this one.
The first broker starts the others as its children, restarts one that dies or stops
answering on its link (links.py), and, after a restart, tells it again what the server was
told that every broker keeps (client shared-memory regions, log and trace settings).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from tritond.crash_window import CrashWindow
from tritond.wire import options as wire_options, schema as S
from tritond.wire.options import ServerOptions

from tritond.broker.shards.links import Link, PeerLinks

log = logging.getLogger("tritond.broker")

RESTART_DELAY_S = 0.5
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0
STOP_WAIT_S = 10.0


@dataclass(eq=False)
class Secondary:
    index: int
    proc: subprocess.Popen | None = None
    pidfd: int = -1
    restart_at: float = 0.0
    deaths: CrashWindow = field(default_factory=lambda: CrashWindow(CRASH_LIMIT, CRASH_WINDOW_S))


class Secondaries:
    def __init__(self, opts: ServerOptions, links: PeerLinks, now: Callable[[], float],
                 give_up: Callable[[], None], known: set[int]) -> None:
        self.opts = opts
        self.links = links
        self.now = now
        self.give_up = give_up          # one keeps dying: this broker stops with an error
        self.known = known              # pids the worker pool must not reap as strays
        self.all = [Secondary(k) for k in range(1, opts.broker_shards)]
        self.fds_changed = True
        self.stopping = False
        self.replay: dict[tuple[str, str], S.ControlOp] = {}   # what a restarted broker is told again
        links.on_restart = self._restarted

    def start(self) -> None:
        for sec in self.all:
            self._spawn(sec)

    def _spawn(self, sec: Secondary) -> None:
        opts = msgspec.structs.replace(self.opts, shard=sec.index, supervisor_pid=os.getpid())
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})   # its loop unblocks it
        try:
            sec.proc = subprocess.Popen([sys.executable, "-m", "tritond.broker.main", wire_options.encode(opts)],
                                        stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        sec.pidfd = os.pidfd_open(sec.proc.pid)
        self.known.add(sec.proc.pid)
        self.links.links[sec.index].heard = self.now()
        self.fds_changed = True
        log.info("broker %d started (pid %d)", sec.index, sec.proc.pid)

    def _restarted(self, link: Link) -> None:
        for op in self.replay.values():
            self.links.tell(link.index, op)

    def remember(self, key: tuple[str, str], op: S.ControlOp | None) -> None:
        """What a restarted broker must be told again (None: nothing any more). A later one
        goes after every other it may override."""
        self.replay.pop(key, None)
        if op is not None:
            self.replay[key] = op

    def pidfds(self) -> set[int]:
        return {sec.pidfd for sec in self.all if sec.pidfd >= 0}

    def pids(self) -> list[int]:
        return [sec.proc.pid for sec in self.all if sec.proc is not None]

    def on_exit(self, pidfd: int) -> None:
        sec = next((s for s in self.all if s.pidfd == pidfd), None)
        if sec is None or sec.proc is None:
            return
        rc = sec.proc.wait()
        os.close(sec.pidfd)
        self.known.discard(sec.proc.pid)
        sec.pidfd, sec.proc = -1, None
        self.fds_changed = True
        self.links.lost(sec.index)
        if self.stopping:
            return
        log.error("broker %d died (%s); restarting it", sec.index, f"signal {-rc}" if rc < 0 else f"exit code {rc}")
        if not sec.deaths.record(self.now()):
            log.error("broker %d died %d times in %ds; giving up", sec.index, len(sec.deaths), int(CRASH_WINDOW_S))
            self.give_up()
            return
        sec.restart_at = self.now() + RESTART_DELAY_S

    def tick(self, now: float) -> float:
        """Restarts that are due and hung brokers killed; returns seconds until the next
        restart (at most 1)."""
        wait = 1.0
        for sec in self.all:
            if sec.proc is None:
                if not self.stopping and sec.restart_at:
                    if now >= sec.restart_at:
                        sec.restart_at = 0.0
                        self._spawn(sec)
                    else:
                        wait = min(wait, sec.restart_at - now)
                continue
            link = self.links.links[sec.index]
            if now - link.heard > self.opts.broker_hang_timeout_secs:
                log.error("broker %d sent nothing for %.0fs; killing it", sec.index, now - link.heard)
                sec.proc.kill()
                link.heard = now
        return max(0.0, wait)

    def signal(self, sig: int) -> None:
        for sec in self.all:
            if sec.proc is not None:
                sec.proc.send_signal(sig)

    def stop(self) -> None:
        """Stop every other broker and wait for them (each drains as this one did)."""
        self.stopping = True
        for sec in self.all:
            if sec.proc is not None:
                self.links.tell(sec.index, S.StopServer())
        for sec in self.all:
            if sec.proc is None:
                continue
            try:
                sec.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                sec.proc.kill()
                sec.proc.wait()
            os.close(sec.pidfd)
            self.known.discard(sec.proc.pid)
            sec.proc, sec.pidfd = None, -1

    def merged(self, own: S.Table) -> S.Table:
        """Every broker's table as one: what the supervisor waits on and reports."""
        others = [link.table for link in self.links.links.values()]
        tables = [own, *(t for t in others if t is not None)]
        started = own.startup_done and all(t is not None and t.startup_done for t in others)
        return S.Table(own.epoch, [e for t in tables for e in t.models], sorted({n for t in tables for n in t.names}),
                       started, own.stopping, own.boot)
