"""The supervisor's loop: start the server, then wait for what needs acting on (a signal, a
child's death, a frontend's readiness message, the broker's messages and silence) until
the server stops.

Under systemd it sends READY=1 once the server is ready, STATUS= lines as the state
changes, STOPPING=1 on drain, and WATCHDOG=1 while the broker is healthy (watchdog.py).

SIGHUP is forwarded to every frontend and to the broker. Children start with SIGHUP blocked
(children.py), so one that arrives before a child is ready to act on it waits instead of
killing it: frontends unblock it once they can reload their certificates, the broker once
its loop can rescan the repository (poll mode); workers keep it blocked.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec

from tritond import logs
from tritond.crash_window import CrashWindow
from tritond.frontend.readiness import SERVING
from tritond.mps import MpsDaemon, from_options
from tritond.notify import Notifier
from tritond.repository.remote import CACHE_ENV, is_remote
from tritond.shm.naming import PREFIX, new_server_id
from tritond.wire import options as wire_options, schema as S
from tritond.wire.addresses import Addresses
from tritond.wire.options import ServerOptions

from .broker_link import BrokerLink, Waitable
from .children import Child, ChildProcesses
from .clock import Clock
from .exit_codes import ExitCode
from .restart import Restarts, restart_window
from .signals import Signals
from .startup import (CLOSED, Interrupted, Startup, StartupError, check_gpu_budgets, check_ports,
                      check_remote_repositories, check_tls)
from .stopping import Stopping
from .watchdog import BrokerWatchdog

log = logging.getLogger("tritond")


class Supervisor(Startup, Restarts, Stopping):
    """The constructor only wires the parts; `run` (through `start`) makes the run
    directory, installs the signal handlers and starts processes, and the ZeroMQ context
    comes with the first connection. So a test builds one with a fake clock, child table and
    broker link, and calls `Signals.caught` for a signal."""

    def __init__(self, opts: ServerOptions, *, clock: Clock | None = None, children: ChildProcesses | None = None,
                 link: BrokerLink | None = None, signals: Signals | None = None,
                 notify: Notifier | None = None) -> None:
        self.server_id = new_server_id()
        self.opts = opts
        self.clock = clock or Clock()
        self.children = children or ChildProcesses(self.clock)
        self.link = link or BrokerLink()
        self.signals = signals or Signals()
        self.notify = notify or Notifier()
        self.broker = Child("broker", "tritond.broker.main")
        self.frontends: list[Child] = []
        self.deaths: defaultdict[Child, CrashWindow] = defaultdict(restart_window)
        self.watchdog = BrokerWatchdog(self.broker, self.children, self.clock, self.notify,
                                       opts.broker_hang_timeout_secs)
        self.table: S.Table | None = None    # the broker's model table, as last sent
        self.serving = False                 # startup finished: every frontend has been told to serve
        self.run_dir = ""
        self.addr: Addresses | None = None
        self.mps: MpsDaemon | None = None

    def start(self) -> None:
        """The private run directory and the options every child gets, then the signal handlers."""
        self.run_dir = tempfile.mkdtemp(prefix="tritond-")
        os.chmod(self.run_dir, 0o700)
        opts = msgspec.structs.replace(self.opts, server_id=self.server_id, run_dir=self.run_dir,
                                       supervisor_pid=os.getpid())
        if any(is_remote(r) for r in opts.model_repositories) and not os.environ.get(CACHE_ENV):
            os.environ[CACHE_ENV] = os.path.join(self.run_dir, "model-cache")   # the children's, removed at exit
        self.mps = from_options(opts, self.run_dir)
        if self.mps is not None:
            opts = msgspec.structs.replace(opts, mps_env=self.mps.worker_env())
        self.opts = opts
        self.addr = Addresses(self.run_dir)
        self.signals.install()

    def run(self) -> ExitCode:
        try:
            self.start()
            log.info("server id %s: its shared-memory segments are /dev/shm/%s%s.*", self.server_id, PREFIX,
                     self.server_id)
            return self.serve()
        finally:
            self.cleanup()

    def serve(self) -> ExitCode:
        try:
            check_tls(self.opts)
            check_gpu_budgets(self.opts)
            check_ports(self.opts)
            self.notify.status("loading models")
            check_remote_repositories(self.opts)
            self.start_broker()
            self.log_model_table()
            failed = self.failed_models()
            if failed and self.opts.exit_on_error:
                log.error("exiting: a model failed to load at startup (--exit-on-error=true): %s", ", ".join(failed))
                self.stop_broker()
                return ExitCode.STARTUP_FAILED
            self.check_shm()
            self.notify.status("starting frontends")
            self.start_frontends()
        except Interrupted:
            log.info("stopping: interrupted during startup")
            self.stop_all()
            return ExitCode.CLEAN
        except StartupError as e:
            log.error("%s", e)
            self.notify.status(f"startup failed: {e}")
            self.stop_all()
            return ExitCode.STARTUP_FAILED
        self.notify.ready(self.serving_status())
        return self.watch()

    def watch(self) -> ExitCode:
        while True:
            children = [self.broker, *self.frontends]
            links = [f for f in self.frontends if f.link is not None and f.link_state not in (SERVING, CLOSED)]
            ready = self.wait([c.pidfd for c in children] + [f.link for f in links], self.watchdog.timeout(1.0))
            if self.signals.stop:
                return self.graceful_stop()
            if self.signals.hangups:
                self.signals.hangups = 0
                self.forward_hangup()
            if self.signals.reopens:
                self.signals.reopens = 0
                self.reopen_logs()
            self.receive()
            for f in links:
                if f.link in ready:
                    self.on_link(f)
            self.watchdog.check()
            self.watchdog.pet()
            for c in children:
                if c.pidfd in ready:
                    code = self.on_child_exit(c)
                    if code is not None:
                        return code
                    self.notify.status(self.serving_status())

    def wait(self, fds: Iterable[Waitable], timeout_s: float) -> set[Waitable]:
        """Wait at most `timeout_s` for a signal, a message from the broker or one of `fds`
        to be readable; returns those of `fds` that are."""
        ready = self.link.wait([self.signals.fd, *fds], timeout_s)
        if self.signals.fd in ready:
            self.signals.clear_wakeup()
        return ready

    def receive(self) -> list[S.ControlReply]:
        """Act on everything the broker has sent (any message says it is alive); returns the
        control replies among it."""
        replies = []
        while self.link.pending():
            msg = self.link.receive()
            self.watchdog.heard()
            if isinstance(msg, S.Table):
                self.table = msg
                self.watchdog.started = msg.startup_done
            elif isinstance(msg, S.Observe):
                logs.apply(msg.log)
            elif isinstance(msg, S.ControlReply):
                replies.append(msg)
        return replies

    def control(self, op: S.ControlOp, timeout_s: float) -> Any:
        """Send a control op to the broker and wait for its answer (None on timeout/death)."""
        cid = self.link.request(op)
        deadline = self.clock.now() + timeout_s
        while self.clock.now() < deadline:
            if not self.children.running(self.broker):
                return None
            self.wait([self.broker.pidfd], 0.1)
            for reply in self.receive():
                if reply.cid == cid:
                    return reply.result
            self.watchdog.pet()
        return None

    def spawn(self, child: Child) -> None:
        """Start `child`'s process; a frontend gets a new readiness socket pair."""
        opts = msgspec.structs.replace(self.opts, **child.extra)
        if child is self.broker:
            self.children.spawn(child, wire_options.encode(opts))
            return
        if child.link is not None:
            child.link.close()
        child.link, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child.link_state = b""
        with theirs:
            opts = msgspec.structs.replace(opts, ready_fd=theirs.fileno())
            self.children.spawn(child, wire_options.encode(opts), pass_fds=(theirs.fileno(),))

    def forward_hangup(self) -> None:
        """SIGHUP: frontends reload their TLS certificates; the broker rescans the repository
        in poll mode."""
        children = [c for c in [self.broker, *self.frontends] if self.children.running(c)]
        log.info("SIGHUP: forwarding to %d processes (frontends reload their TLS certificates, the broker "
                 "rescans the repository in poll mode)", len(children))
        for c in children:
            self.children.signal(c, signal.SIGHUP)

    def reopen_logs(self) -> None:
        """SIGUSR1 (logrotate moved the log file): this process and, through the broker,
        every other one open the file again."""
        logs.reopen()
        self.link.tell(S.ReopenLog())
