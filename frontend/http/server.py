"""Entry point of an HTTP frontend process (uvicorn+httptools, or hypercorn).

`python -m tritond.frontend.http.server <options-json>`. Several of these may listen on one
port (SO_REUSEPORT); the first one also serves /metrics when a metrics port is given.
With TLS each port keeps a swappable context that SIGHUP reloads (frontend/tls.py).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass

import uvloop
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tritond.shm.heap import keep_large_allocations
from tritond.wire.errors import TritonError
from tritond.wire.options import ServerOptions

from ..client_subject import subject_rules
from ..metadata import server_extensions
from ..metrics import CONTENT_TYPE, MetricsEndpoint
from ..process import frontend_dataplane, start_process
from ..tls import Reloader, SwappableContext, TlsError, TlsFiles, load
from .app import HttpApi, HttpOptions
from .limits import ConnectionCap, HttpLimits, RequestLimits, cap_hypercorn, uvicorn_protocol
from .peers import PeerCertificates
from .sink import sink_protocol

log = logging.getLogger("tritond.http")
HYPERCORN_ALPN = ["h2", "http/1.1"]


def listen_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def metrics_app(endpoint: MetricsEndpoint) -> Starlette:
    async def metrics(request):
        try:
            body = await endpoint.render()
        except TritonError as e:
            return PlainTextResponse(e.message, status_code=503)
        return Response(body, media_type=CONTENT_TYPE)
    return Starlette(routes=[Route("/metrics", metrics)])


@dataclass
class Tls:
    """The TLS contexts of this process's ports (None: that port is clear text). Metrics use
    the HTTP certificate settings, so one reload serves both."""
    files: TlsFiles | None = None
    api: SwappableContext | None = None
    metrics: SwappableContext | None = None

    @classmethod
    def from_options(cls, opts: ServerOptions) -> "Tls":
        files = TlsFiles.from_options("http", opts.http_tls)
        if files is None:
            return cls()
        material = load(files)
        alpn = HYPERCORN_ALPN if opts.http_server == "hypercorn" else None
        metrics = SwappableContext(material) if opts.metrics_tls and opts.metrics_port else None
        return cls(files, SwappableContext(material, alpn), metrics)

    def reloader(self) -> Reloader | None:
        if self.files is None:
            return None
        ports = [p for p in (self.api, self.metrics) if p is not None]

        def switch(contexts: list) -> None:
            for port, context in zip(ports, contexts):
                port.use(context)
        return Reloader(self.files, lambda material: [p.build(material) for p in ports], switch)


async def serve_uvicorn(app, sock: socket.socket, stop: asyncio.Event, limits: HttpLimits,
                        tls: SwappableContext | None = None, peers: PeerCertificates | None = None,
                        api: HttpApi | None = None) -> None:
    """`api`: the HTTP API `app` serves, whose large binary infer bodies go straight to the
    frontend's arena (sink.py)."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    base = peers.protocol(HttpToolsProtocol) if peers else HttpToolsProtocol
    protocol = uvicorn_protocol(base, limits, ConnectionCap(limits, f"uvicorn on port {sock.getsockname()[1]}"))
    if api is not None:
        protocol = sink_protocol(protocol, api.dp.arena, api.infer_route.target, api.infer_route.limit)
    # log_config=None: uvicorn's default dictConfig would close every handler this process
    # logs through (a --log-file's stream), leaving later lines nowhere to go
    config = uvicorn.Config(app, http=protocol, loop="none", lifespan="off", access_log=False, log_level="warning",
                            log_config=None,
                            timeout_graceful_shutdown=None, proxy_headers=False,
                            timeout_keep_alive=limits.keepalive_timeout_secs,
                            ssl_context_factory=(lambda _config, _default: tls.context) if tls else None)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await stop.wait()
    server.should_exit = True
    await task


async def serve_hypercorn(app, sock: socket.socket, stop: asyncio.Event, limits: HttpLimits,
                          tls: SwappableContext | None = None) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    class TlsConfig(Config):
        """Serves this process's swappable context on the bound socket."""
        @property
        def ssl_enabled(self) -> bool:
            return True

        def create_ssl_context(self):
            return tls.context

    config = TlsConfig() if tls else Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = limits.keepalive_timeout_secs   # also bounds the wait for a request head
    config.h11_max_incomplete_size = limits.max_header_size
    config.h2_max_header_list_size = limits.max_header_size
    cap_hypercorn(limits, ConnectionCap(limits, f"hypercorn on port {sock.getsockname()[1]}"))
    await serve(RequestLimits(app, limits), config, shutdown_trigger=stop.wait)


async def run(opts: ServerOptions) -> None:
    tls = Tls.from_options(opts)
    reloader = tls.reloader()
    subjects = subject_rules(opts.http_restricted_subjects)
    peers = PeerCertificates() if subjects else None
    async with frontend_dataplane(opts, "http", reloader.reload if reloader else None) as (
            dataplane, stop, listening):
        api = HttpApi(dataplane, HttpOptions(
            server_name=opts.server_name,
            strict_readiness=opts.strict_readiness,
            extensions=server_extensions(opts),
            max_input_size=opts.http_max_input_size,
            restricted=opts.http_restricted,
            subjects=subjects,
            client_certificate=peers.certificate if peers else None,
            header_forward=opts.http_header_forward,
            init_failed=bool(opts.init_failed),
            paged=opts.model_control_mode == "paged",
        ))
        sock = listen_socket(opts.http_address, opts.http_port)
        limits = HttpLimits.from_options(opts.http_limits)
        if opts.http_server == "hypercorn":
            servers = [serve_hypercorn(api.app(), sock, stop, limits, tls.api)]
        else:
            servers = [serve_uvicorn(api.app(), sock, stop, limits, tls.api, peers, api)]
        if opts.metrics_port:
            endpoint = MetricsEndpoint(dataplane.client, opts)
            endpoint.start()
            servers.append(serve_uvicorn(metrics_app(endpoint), listen_socket(
                opts.metrics_address, opts.metrics_port), stop, limits, tls.metrics))
        listening()    # the sockets listen: connections queue until the servers accept them
        await asyncio.gather(*servers)


def main(argv: list[str]) -> int:
    opts = start_process(argv, "http")
    keep_large_allocations()
    try:
        uvloop.run(run(opts))
    except TlsError as e:
        log.error("HTTP frontend cannot serve TLS: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
