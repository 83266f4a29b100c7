"""The process the user started: starts the broker and the frontends, restarts them when
they die, turns SIGTERM/SIGINT into a graceful drain, and leaves nothing behind.

Exit codes: 0 clean stop; 1 startup failure (a model failed with --exit-on-error, a port
could not be bound, the broker would not start); 2 in-flight requests had to be cancelled
at the exit timeout; 3 the broker or a frontend kept dying, or the broker could not be
restarted, and the server gave up.

Ready means every startup model has loaded and every frontend process (each HTTP and each
gRPC worker) is serving: each frontend says "listening" over a socket pair once its port is
open, is told "serving" when all are, answers ready from then on and acknowledges. Under systemd the
supervisor then sends READY=1, STATUS= lines as the state changes, STOPPING=1 on drain, and
WATCHDOG=1 while the broker is healthy. The broker pings twice a second: one silent for 3 s is
not healthy (the frontends fail its requests too), one silent for `--broker-hang-timeout-secs`
is hung: it is killed and restarted like a dead one.

After a child dies its shared-memory segments are swept; after the broker dies, also its
workers' (they die with it by parent-death signal; any that linger are killed first).

SIGHUP is forwarded to every frontend and to the broker. Children start with SIGHUP blocked
(the mask survives exec), so one that arrives before a child is ready to act on it waits
instead of killing it: frontends unblock it once they can reload their certificates, the
broker once its loop can rescan the repository (poll mode); workers keep it blocked.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from tritond.frontend.broker_client import BROKER_SILENCE_S
from tritond.frontend.readiness import LISTENING, SERVING
from tritond.frontend.tls import TlsError, TlsFiles, load as load_tls, server_context
from tritond import logs
from tritond.mps import MpsError, from_options
from tritond.notify import Notifier
from tritond.repository.remote import CACHE_ENV, RemoteError, is_remote, list_models
from tritond.shm.naming import PREFIX, new_server_id, owner_prefix, sweep
from tritond.shm_space import shm_shortfall
from tritond.wire import options as wire_options, schema as S
from tritond.wire.addresses import Addresses
from tritond.wire.options import ServerOptions

log = logging.getLogger("tritond")

RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
STARTUP_TIMEOUT_S = 600.0
ORPHAN_GRACE_S = 2.0
FRONTEND_START_S = 60.0
CLOSED = b"closed"


@dataclass
class Child:
    role: str                     # broker | http | grpc
    module: str
    extra: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    pidfd: int = -1
    deaths: list[float] = field(default_factory=list)
    link: socket.socket | None = None     # frontends: the supervisor's end of the readiness pair
    link_state: bytes = b""               # frontends: b"" | LISTENING | SERVING (acknowledged) | CLOSED
    hung: bool = False                    # killed by the supervisor for not answering


class StartupError(Exception):
    pass


class Interrupted(StartupError):
    """SIGTERM/SIGINT arrived while the broker was (re)starting."""


def processes_of(server_id: str, exclude: set[int]) -> list[int]:
    """Live tritond processes (`python -m tritond.*` with this server's id in their
    options) other than `exclude`: what must be gone before segments are swept."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if (not zombie and len(argv) >= 4 and argv[1] == b"-m" and argv[2].startswith(b"tritond.")
                and server_id.encode() in argv[3]):
            out.append(int(entry))
    return out


class Supervisor:
    def __init__(self, opts: ServerOptions) -> None:
        self.server_id = new_server_id()
        self.run_dir = tempfile.mkdtemp(prefix="tritond-")
        os.chmod(self.run_dir, 0o700)
        self.opts = msgspec.structs.replace(opts, server_id=self.server_id, run_dir=self.run_dir,
                                            supervisor_pid=os.getpid())
        if any(is_remote(r) for r in opts.model_repositories) and not os.environ.get(CACHE_ENV):
            os.environ[CACHE_ENV] = os.path.join(self.run_dir, "model-cache")   # the children's, removed at exit
        self.mps = from_options(opts, self.run_dir)
        if self.mps is not None:
            self.opts = msgspec.structs.replace(self.opts, mps_env=self.mps.worker_env())
        self.addr = Addresses(self.run_dir)
        self.ctx = zmq.Context()
        self.sock: zmq.Socket | None = None
        self.decoder = S.decoder(S.BrokerToFrontend)
        self.table: S.Table | None = None
        self.broker = Child("broker", "tritond.broker.main")
        self.frontends: list[Child] = []
        self.sig_r, sig_w = os.pipe()
        os.set_blocking(sig_w, False)
        signal.set_wakeup_fd(sig_w)
        self.signals: list[int] = []
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda n, _f: self.signals.append(n))
        self.hangups = 0
        signal.signal(signal.SIGHUP, self._on_hangup)
        self.reopens = 0
        signal.signal(signal.SIGUSR1, self._on_usr1)
        self.cids = 0
        self.notify = Notifier()
        self.last_heard = 0.0          # monotonic time of the broker's last message
        self.next_watchdog = 0.0
        self.serving = False           # startup finished: every frontend has been told to serve

    # ---------------------------------------------------------------- children

    def _on_hangup(self, _n: int, _f: Any) -> None:
        self.hangups += 1

    def _on_usr1(self, _n: int, _f: Any) -> None:
        self.reopens += 1

    def reopen_logs(self) -> None:
        """SIGUSR1 (logrotate moved the log file): this process and, through the broker,
        every other one open the file again."""
        logs.reopen()
        self.cids += 1
        try:
            self.sock.send(S.encode(S.Control(self.cids, S.ReopenLog())), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def spawn(self, child: Child) -> None:
        opts = msgspec.structs.replace(self.opts, **child.extra)
        theirs = None
        if child is not self.broker:
            if child.link is not None:
                child.link.close()
            child.link, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            child.link_state = b""
            opts = msgspec.structs.replace(opts, ready_fd=theirs.fileno())
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            child.proc = subprocess.Popen([sys.executable, "-m", child.module, wire_options.encode(opts)],
                                          stdin=subprocess.DEVNULL, close_fds=True,
                                          pass_fds=(theirs.fileno(),) if theirs else ())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if theirs is not None:
                theirs.close()
        child.pidfd = os.pidfd_open(child.proc.pid)

    def forward_hangup(self) -> None:
        """SIGHUP: frontends reload their TLS certificates; the broker rescans the repository
        in poll mode."""
        children = [c for c in [self.broker] + self.frontends if c.proc and c.proc.poll() is None]
        log.info("SIGHUP: forwarding to %d processes (frontends reload their TLS certificates, the broker "
                 "rescans the repository in poll mode)", len(children))
        for c in children:
            c.proc.send_signal(signal.SIGHUP)

    def on_link(self, child: Child) -> None:
        """A frontend reports its port open (then, once every frontend has, or at once after
        the server became ready, it is told to serve), or acknowledges that it serves."""
        try:
            said = child.link.recv(64)
        except OSError:
            said = b""
        if said == LISTENING:
            child.link_state = LISTENING
            if self.serving:
                self.tell_serving(child)
        elif said == SERVING:
            child.link_state = SERVING
        elif not said:
            child.link_state = CLOSED     # the process is exiting; its pidfd says so

    def tell_serving(self, child: Child) -> None:
        try:
            child.link.send(SERVING)
        except OSError:
            pass                       # it died meanwhile; its pidfd reports that

    def heard_from_broker(self) -> None:
        self.last_heard = time.monotonic()

    def broker_silence(self) -> float:
        """Seconds since the running broker last spoke; 0 while it starts (loading models,
        it cannot ping: alive is all that can be known)."""
        if self.table is None or not self.table.startup_done:
            return 0.0
        return time.monotonic() - self.last_heard

    def broker_healthy(self) -> bool:
        p = self.broker.proc
        return p is not None and p.poll() is None and self.broker_silence() < BROKER_SILENCE_S

    def tick_watchdog(self) -> None:
        """WATCHDOG=1 every half WatchdogSec, and only while the broker is healthy: a hung
        server stops petting systemd's watchdog, which then restarts it."""
        if not self.notify.watchdog_s:
            return
        now = time.monotonic()
        if now >= self.next_watchdog and self.broker_healthy():
            self.notify.watchdog()
            self.next_watchdog = now + self.notify.watchdog_s

    def connect(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.addr.frontends)
        self.sock.send(S.encode(S.Hello(S.PROTOCOL_VERSION, "supervisor", os.getpid())))

    def control(self, op: S.ControlOp, timeout: float) -> Any:
        """Send a control op to the broker and wait for its answer (None on timeout/death)."""
        self.cids += 1
        cid = self.cids
        self.sock.send(S.encode(S.Control(cid, op)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.broker.proc.poll() is not None:
                return None
            if self.sock.poll(100):
                msg = self.decoder.decode(self.sock.recv())
                self.heard_from_broker()
                if isinstance(msg, S.ControlReply) and msg.cid == cid:
                    return msg.result
            self.tick_watchdog()
        return None

    def start_broker(self) -> None:
        """Start the broker and wait until it has loaded (or failed) every model."""
        if self.mps is not None:
            try:
                self.mps.start()
            except MpsError as e:
                raise StartupError(str(e)) from None
        self.spawn(self.broker)
        self.connect()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.table = None
        while time.monotonic() < deadline:
            if self.broker.proc.poll() is not None:
                raise StartupError(f"the broker exited during startup (code {self.broker.proc.returncode})")
            if self.signals:
                raise Interrupted("interrupted during startup")
            self.tick_watchdog()
            if self.sock.poll(100):
                msg = self.decoder.decode(self.sock.recv())
                self.heard_from_broker()
                if isinstance(msg, S.Table):
                    self.table = msg
                    if msg.startup_done:
                        return
        raise StartupError("models did not finish loading in time")

    def start_frontends(self) -> None:
        o = self.opts
        if o.allow_http:
            for i in range(o.http_workers):
                extra = {"metrics_port": o.metrics_port if i == 0 else 0}
                self.frontends.append(Child("http", "tritond.frontend.http.server", extra))
        if o.allow_grpc:
            for _ in range(o.grpc_workers):
                self.frontends.append(Child("grpc", "tritond.frontend.grpc.server"))
        for f in self.frontends:
            self.spawn(f)
        self.wait_links(LISTENING)
        self.serving = True
        for f in self.frontends:
            self.tell_serving(f)
        self.wait_links(SERVING)
        for name, host, port in self.ports():
            log.info("Started %s at %s:%d", name, host, port)

    def wait_links(self, state: bytes) -> None:
        """Wait until every frontend process has reached `state` on its link: LISTENING
        (its port is open) or SERVING (it answers ready)."""
        deadline = time.monotonic() + FRONTEND_START_S
        reached = (LISTENING, SERVING) if state == LISTENING else (SERVING,)
        while waiting := [f for f in self.frontends if f.link_state not in reached]:
            if time.monotonic() > deadline:
                late = ", ".join(f"{f.role} (pid {f.proc.pid})" for f in waiting)
                raise StartupError(f"frontends did not start serving in {FRONTEND_START_S:g}s: {late}")
            if self.signals:
                raise Interrupted("interrupted during startup")
            for f in self.frontends:
                if f.proc.poll() is not None:
                    port = self.opts.http_port if f.role == "http" else self.opts.grpc_port
                    raise StartupError(f"the {f.role} frontend exited during startup (code {f.proc.returncode}); "
                                       f"is port {port} already in use?")
            self.tick_watchdog()
            readable, _, _ = select.select([f.link for f in waiting], [], [], 0.1)
            for f in waiting:
                if f.link in readable:
                    self.on_link(f)

    # ---------------------------------------------------------------- main loop

    def failed_models(self) -> list[str]:
        if self.table is None:
            return []
        return [f"'{e.name}' version {e.version}: {e.reason}" for e in self.table.models if e.state is not S.ModelState.READY]

    def run(self) -> int:
        log.info("server id %s: its shared-memory segments are /dev/shm/%s%s.*", self.server_id, PREFIX,
                 self.server_id)
        try:
            return self.serve()
        finally:
            self.cleanup()

    def ports(self) -> list[tuple[str, str, int]]:
        o = self.opts
        out = []
        if o.allow_http:
            out.append(("HTTPService", o.http_address, o.http_port))
            if o.metrics_port:
                out.append(("Metrics Service", o.metrics_address, o.metrics_port))
        if o.allow_grpc:
            out.append(("GRPCInferenceService", o.grpc_address, o.grpc_port))
        return out

    def check_ports(self) -> None:
        """Frontends share their ports with SO_REUSEPORT, which would also let them share a
        port with another server; so first make sure nobody else listens there."""
        for name, host, port in self.ports():
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past connections don't count
                try:
                    s.bind((host, port))
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise StartupError(f"cannot serve {name} on {host}:{port}: {e.strerror}") from None
                    # tritonserver's words, which scripts grep for
                    service = {"HTTPService": "HTTP", "GRPCInferenceService": "GRPC"}.get(name, "Metrics")
                    raise StartupError(f"failed to start {service} service: Unavailable - Socket '{host}:{port}' "
                                       f"already in use") from None

    def check_tls(self) -> None:
        """Certificate files are checked before anything starts: a bad one is a startup error,
        never a port that falls back to clear text."""
        for flag, spec in (("grpc", self.opts.grpc_tls), ("http", self.opts.http_tls)):
            files = TlsFiles.from_options(flag, spec)
            if files is None:
                continue
            try:
                material = load_tls(files)
                if files.flag == "http":
                    server_context(material)   # what OpenSSL itself refuses (a key too weak, ...)
            except TlsError as e:
                raise StartupError(f"cannot serve TLS: {e}") from None
            log.info("%s over TLS%s: %s", files.protocol, " with client certificates" if files.mutual else "",
                     material.describe())

    def serve(self) -> int:
        try:
            self.check_tls()
            self.check_ports()
            self.notify.status("loading models")
            self.check_remote_repositories()
            self.start_broker()
            failed = self.failed_models()
            if failed and self.opts.exit_on_error:
                for line in failed:
                    log.error("failed to load %s", line)
                log.error("exiting: a model failed to load at startup (--exit-on-error=true)")
                self.stop_broker()
                return 1
            self.check_shm()
            self.notify.status("starting frontends")
            self.start_frontends()
        except Interrupted:
            log.info("stopping: interrupted during startup")
            self.stop_all()
            return 0
        except StartupError as e:
            log.error("%s", e)
            self.notify.status(f"startup failed: {e}")
            self.stop_all()
            return 1
        self.notify.ready(self.serving_status())
        return self.watch()

    def check_remote_repositories(self) -> None:
        """List each remote repository once before the broker starts, so that an unreachable
        or missing bucket is one clear startup error (what was fetched stays in the cache)."""
        for repo in self.opts.model_repositories:
            if is_remote(repo):
                try:
                    list_models(repo)
                except RemoteError as e:
                    raise StartupError(str(e)) from None

    def check_shm(self) -> None:
        """Log an error when /dev/shm cannot hold the arenas of every process."""
        snapshot = self.control(S.ModelMetrics(), 10.0)
        workers = sum(m.instances_ready for m in snapshot.models) if snapshot is not None else 0
        o = self.opts
        frontends = (o.http_workers if o.allow_http else 0) + (o.grpc_workers if o.allow_grpc else 0)
        why = shm_shortfall(frontends, workers)
        if why:
            log.error("%s", why)

    def serving_status(self) -> str:
        ready = 0 if self.table is None else sum(e.state is S.ModelState.READY for e in self.table.models)
        where = ", ".join(f"{name} {host}:{port}" for name, host, port in self.ports())
        return f"serving {ready} model versions; {where}"

    def watch(self) -> int:
        poller = zmq.Poller()
        poller.register(self.sig_r, zmq.POLLIN)
        while True:
            children = [self.broker] + self.frontends
            links = [f for f in self.frontends if f.link_state not in (SERVING, CLOSED) and f.link is not None]
            for c in children:
                poller.register(c.pidfd, zmq.POLLIN)
            for f in links:
                poller.register(f.link, zmq.POLLIN)
            poller.register(self.sock, zmq.POLLIN)
            timeout = 1.0
            if self.notify.watchdog_s:
                timeout = min(timeout, max(0.0, self.next_watchdog - time.monotonic()))
            events = dict(poller.poll(int(timeout * 1000)))
            for c in children:
                poller.unregister(c.pidfd)
            for f in links:
                poller.unregister(f.link)
            poller.unregister(self.sock)
            if self.sig_r in events:
                os.read(self.sig_r, 64)
            if self.signals:
                return self.graceful_stop()
            if self.hangups:
                self.hangups = 0
                self.forward_hangup()
            if self.reopens:
                self.reopens = 0
                self.reopen_logs()
            while self.sock.poll(0):
                msg = self.decoder.decode(self.sock.recv())
                self.heard_from_broker()
                if isinstance(msg, S.Table):
                    self.table = msg
                elif isinstance(msg, S.Observe):
                    logs.apply(msg.log)
            for f in links:
                if f.link in events:
                    self.on_link(f)
            self.check_hung()
            self.tick_watchdog()
            for c in children:
                if c.pidfd in events:
                    code = self.on_child_exit(c)
                    if code is not None:
                        return code
                    self.notify.status(self.serving_status())

    def check_hung(self) -> None:
        """Kill a broker that stopped pinging; its pidfd then reports the death and it is
        restarted like any dead broker."""
        p = self.broker.proc
        silence = self.broker_silence()
        if silence < self.opts.broker_hang_timeout_secs or p is None or p.poll() is not None or self.broker.hung:
            return
        log.error("the broker (pid %d) sent nothing for %.1fs: it is hung; killing it", p.pid, silence)
        self.notify.status("the broker is hung; restarting it")
        self.broker.hung = True
        p.kill()

    def on_child_exit(self, child: Child) -> int | None:
        """Restart a dead child, or give up (exit code 3) when it keeps dying."""
        rc = child.proc.wait()
        os.close(child.pidfd)
        child.pidfd = -1
        now = time.monotonic()
        child.deaths = [t for t in child.deaths if now - t < RESTART_WINDOW_S] + [now]
        cause = "was killed as hung" if child.hung else "died"
        child.hung = False
        log.error("the %s process (pid %d) %s (%s); restarting it", child.role, child.proc.pid, cause,
                  f"signal {-rc}" if rc < 0 else f"exit code {rc}")
        self.notify.status(f"the {child.role} process {cause}; restarting it")
        if len(child.deaths) > RESTART_LIMIT:
            log.error("the %s process died %d times in %ds; giving up", child.role, len(child.deaths),
                      int(RESTART_WINDOW_S))
            self.notify.stopping(f"gave up: the {child.role} process kept dying")
            self.stop_all()
            return 3
        if child is not self.broker:
            sweep(owner_prefix(self.server_id, f"f{child.proc.pid}"))
            self.spawn(child)
            return None
        self.reap_orphans({f.proc.pid for f in self.frontends if f.proc})
        sweep(f"{PREFIX}{self.server_id}.w")
        sweep(owner_prefix(self.server_id, "b"))        # the response cache's arena
        try:
            self.start_broker()
        except Interrupted:
            log.info("stopping: interrupted while the broker restarted")
            self.stop_all()
            return 0
        except StartupError as e:
            log.error("could not restart the broker: %s", e)
            self.notify.stopping(f"gave up: could not restart the broker: {e}")
            self.stop_all()
            return 3
        log.info("the broker is back (pid %d)", self.broker.proc.pid)
        return None

    def reap_orphans(self, keep: set[int]) -> None:
        """Wait briefly for processes of this server outside `keep` to go, then kill them."""
        keep = keep | {os.getpid()}
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while (left := processes_of(self.server_id, keep)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            log.warning("killing leftover process %d", pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = processes_of(self.server_id, keep)

    # ---------------------------------------------------------------- stopping

    def graceful_stop(self) -> int:
        """Drain in-flight work within --exit-timeout-secs, then stop every process."""
        log.info("stopping: draining in-flight requests (timeout %gs)", self.opts.exit_timeout_secs)
        self.notify.stopping("draining in-flight requests")
        result = self.control(S.Drain(), self.opts.exit_timeout_secs + 5)
        drained = result is not None and result.drained
        self.stop_all()
        if not drained:
            log.error("exit timeout expired with requests in flight; they were cancelled")
            return 2
        return 0

    def stop_frontends(self) -> None:
        for f in self.frontends:
            if f.proc and f.proc.poll() is None:
                f.proc.send_signal(signal.SIGTERM)
        for f in self.frontends:
            if f.proc:
                try:
                    f.proc.wait(10)
                except subprocess.TimeoutExpired:
                    f.proc.kill()
                    f.proc.wait()

    def stop_broker(self) -> None:
        p = self.broker.proc
        if p is None or p.poll() is not None:
            return
        self.control(S.StopServer(), 2.0)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_all(self) -> None:
        self.stop_frontends()
        self.stop_broker()

    def cleanup(self) -> None:
        """Idempotent: close sockets, end leftover processes, sweep segments and the run dir."""
        if self.sock is not None:
            self.sock.close(0)
        if not self.ctx.closed:
            self.ctx.term()
        self.reap_orphans(set())
        if self.mps is not None:
            self.mps.stop()
        for f in self.frontends:
            if f.link is not None:
                f.link.close()
                f.link = None
        self.notify.close()
        sweep(f"{PREFIX}{self.server_id}.")
        shutil.rmtree(self.run_dir, ignore_errors=True)
