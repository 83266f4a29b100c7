"""Startup, in order: the checks that need nothing started (TLS files, ports, remote
repositories); the broker, until every startup model has loaded or failed; the frontends,
until each serves.

Ready means every startup model has loaded and every frontend process (each HTTP and each
gRPC worker) is serving: each frontend says "listening" over a socket pair once its port is
open, is told "serving" when all are, answers ready from then on and acknowledges."""
from __future__ import annotations

import errno
import logging
import socket

from tritond import logs
from tritond.broker.paging.device_memory import device_memory_unreadable
from tritond.frontend.readiness import LISTENING, SERVING
from tritond.frontend.tls import TlsError, TlsFiles, load as load_tls, server_context
from tritond.mps import MpsError
from tritond.repository.devices import gpu_count
from tritond.repository.remote import RemoteError, is_remote, list_models
from tritond.shm_space import shm_shortfall
from tritond.wire import schema as S
from tritond.wire.options import ServerOptions

from .children import Child

log = logging.getLogger("tritond")

STARTUP_TIMEOUT_S = 600.0
FRONTEND_START_S = 60.0
CLOSED = b"closed"        # a frontend's link state once its end closed (the process is exiting)


class StartupError(Exception):
    """The server cannot (re)start: it stops with a message."""


class Interrupted(StartupError):
    """SIGTERM/SIGINT arrived while the broker was (re)starting."""


def ports(opts: ServerOptions) -> list[tuple[str, str, int]]:
    """(service, host, port) for each port the server serves."""
    out = []
    if opts.allow_http:
        out.append(("HTTPService", opts.http_address, opts.http_port))
        if opts.metrics_port:
            out.append(("Metrics Service", opts.metrics_address, opts.metrics_port))
    if opts.allow_grpc:
        out.append(("GRPCInferenceService", opts.grpc_address, opts.grpc_port))
    if opts.openai is not None:
        out.append(("OpenAI frontend", opts.openai.address, opts.openai.port))
    return out


def _port_of(opts: ServerOptions, role: str) -> int:
    if role == "openai" and opts.openai is not None:
        return opts.openai.port
    return opts.http_port if role == "http" else opts.grpc_port


def check_ports(opts: ServerOptions) -> None:
    """Frontends share their ports with SO_REUSEPORT, which would also let them share a
    port with another server; so first make sure nobody else listens there."""
    for name, host, port in ports(opts):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past connections don't count
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise StartupError(f"cannot serve {name} on {host}:{port}: {e.strerror}") from None
                # tritonserver's words, which scripts grep for
                service = {"HTTPService": "HTTP", "GRPCInferenceService": "GRPC",
                           "OpenAI frontend": "OpenAI"}.get(name, "Metrics")
                raise StartupError(f"failed to start {service} service: Unavailable - Socket '{host}:{port}' "
                                   f"already in use") from None


def check_tls(opts: ServerOptions) -> None:
    """Certificate files are checked before anything starts: a bad one is a startup error,
    never a port that falls back to clear text."""
    openai_tls = opts.openai.tls if opts.openai is not None else None
    for flag, spec in (("grpc", opts.grpc_tls), ("http", opts.http_tls or openai_tls)):
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


def check_remote_repositories(opts: ServerOptions) -> None:
    """List each remote repository once before the broker starts, so that an unreachable
    or missing bucket is one clear startup error (what was fetched stays in the cache)."""
    for repo in opts.model_repositories:
        if is_remote(repo):
            try:
                list_models(repo)
            except RemoteError as e:
                raise StartupError(str(e)) from None


def check_gpu_budgets(opts: ServerOptions) -> None:
    """Each --model-gpu-memory-budget names a GPU of this host whose processes NVML lists."""
    if not opts.model_gpu_memory_budget:
        return
    gpus = gpu_count()
    for gpu in opts.model_gpu_memory_budget:
        if gpu >= gpus:
            raise StartupError(f"--model-gpu-memory-budget names GPU {gpu}, which this host does not have "
                               f"({gpus} GPU(s))")
    why = device_memory_unreadable(opts.model_gpu_memory_budget)
    if why:
        raise StartupError(f"--model-gpu-memory-budget needs each process's device memory from NVML: {why}")


class Startup:
    """Supervisor's steps that start the broker and the frontends (core.py holds the parts
    they use)."""

    def start_broker(self) -> None:
        """Start the broker and wait until it has loaded (or failed) every model."""
        if self.mps is not None:
            try:
                self.mps.start()
            except MpsError as e:
                raise StartupError(str(e)) from None
        self.spawn(self.broker)
        self.link.connect(self.addr.frontends)
        self.table = None
        self.watchdog.started = False
        deadline = self.clock.now() + STARTUP_TIMEOUT_S
        while self.clock.now() < deadline:
            code = self.children.exit_code(self.broker)
            if code is not None:
                raise StartupError(f"the broker exited during startup (code {code})")
            if self.signals.stop:
                raise Interrupted("interrupted during startup")
            self.watchdog.pet()
            self.wait([self.broker.pidfd], 0.1)
            self.receive()
            if self.table is not None and self.table.startup_done:
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
        if o.openai is not None:
            self.frontends.append(Child("openai", "tritond.frontend.openai.server"))
        for f in self.frontends:
            self.spawn(f)
        self.wait_links(LISTENING)
        self.serving = True
        for f in self.frontends:
            self.tell_serving(f)
        self.wait_links(SERVING)
        for name, host, port in ports(o):
            log.info("Started %s at %s:%d", name, host, port)

    def wait_links(self, state: bytes) -> None:
        """Wait until every frontend process has reached `state` on its link: LISTENING
        (its port is open) or SERVING (it answers ready)."""
        deadline = self.clock.now() + FRONTEND_START_S
        reached = (LISTENING, SERVING) if state == LISTENING else (SERVING,)
        while waiting := [f for f in self.frontends if f.link_state not in reached]:
            if self.clock.now() > deadline:
                late = ", ".join(f"{f.role} (pid {f.pid})" for f in waiting)
                raise StartupError(f"frontends did not start serving in {FRONTEND_START_S:g}s: {late}")
            if self.signals.stop:
                raise Interrupted("interrupted during startup")
            for f in self.frontends:
                code = self.children.exit_code(f)
                if code is not None:
                    port = _port_of(self.opts, f.role)
                    raise StartupError(f"the {f.role} frontend exited during startup (code {code}); "
                                       f"is port {port} already in use?")
            self.watchdog.pet()
            readable = self.wait([f.link for f in waiting], 0.1)
            self.receive()
            for f in waiting:
                if f.link in readable:
                    self.on_link(f)

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

    def check_shm(self) -> None:
        """Log an error when /dev/shm cannot hold the arenas of every process."""
        snapshot = self.control(S.ModelMetrics(), 10.0)
        workers = sum(m.instances_ready for m in snapshot.models) if snapshot is not None else 0
        o = self.opts
        frontends = ((o.http_workers if o.allow_http else 0) + (o.grpc_workers if o.allow_grpc else 0)
                     + (o.openai is not None))
        why = shm_shortfall(frontends, workers)
        if why:
            log.error("%s", why)

    def failed_models(self) -> list[str]:
        """The models that did not load, by name (and version where one was found); the broker
        has logged why, once."""
        if self.table is None:
            return []
        paged = self.opts.model_control_mode == "paged"     # a paged-out model is not a failed one
        failed = [f"'{e.name}'" + (f" version {e.version}" if e.version else "") for e in self.table.models
                  if e.state is not S.ModelState.READY and not (paged and e.restarting)]
        if self.opts.model_control_mode in ("explicit", "paged") and "*" not in self.opts.load_models:
            known = set(self.table.names)       # a startup model no repository holds fails, as in Triton
            failed += [f"'{name}'" for name in self.opts.load_models if name not in known]
        return failed

    def log_model_table(self) -> None:
        """Triton's table of the models after the start-up loads: each version READY, or
        UNAVAILABLE with the reason (what scripts grep the start-up log for)."""
        if self.table is None or not self.table.models:
            return
        rows = [[e.name, str(e.version) if e.version else "",
                 "READY" if e.state is S.ModelState.READY else ": ".join(filter(None, ("UNAVAILABLE", e.reason)))]
                for e in sorted(self.table.models, key=lambda e: (e.name, e.version))]
        log.info("", extra={"table": logs.table_text(["Model", "Version", "Status"], rows)})

    def serving_status(self) -> str:
        ready = 0 if self.table is None else sum(e.state is S.ModelState.READY for e in self.table.models)
        where = ", ".join(f"{name} {host}:{port}" for name, host, port in ports(self.opts))
        return f"serving {ready} model versions; {where}"
