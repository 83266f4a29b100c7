"""Entry point of an HTTP frontend process (uvicorn+httptools, or hypercorn).

`python -m tritond.frontend.http.server <options-json>`. Several of these may listen on one
port (SO_REUSEPORT); the first one also serves /metrics when a metrics port is given.
"""
from __future__ import annotations

import asyncio
import socket
import sys

import uvloop
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ..broker_client import BrokerClient
from ..errors import TritonError
from ..metrics import render
from ..process import frontend_dataplane, start_process
from .app import HttpApi, HttpOptions


def listen_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def metrics_app(client: BrokerClient) -> Starlette:
    async def metrics(request):
        try:
            stats = await client.control("metrics", {}, timeout=5)
        except TritonError as e:
            return PlainTextResponse(e.message, status_code=503)
        return PlainTextResponse(render(stats), media_type="text/plain; version=0.0.4")
    return Starlette(routes=[Route("/metrics", metrics)])


async def serve_uvicorn(app, sock: socket.socket, stop: asyncio.Event) -> None:
    import uvicorn
    config = uvicorn.Config(app, http="httptools", loop="none", lifespan="off", access_log=False,
                            log_level="warning", timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await stop.wait()
    server.should_exit = True
    await task


async def serve_hypercorn(app, sock: socket.socket, stop: asyncio.Event) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    await serve(app, config, shutdown_trigger=stop.wait)


async def run(opts: dict) -> None:
    async with frontend_dataplane(opts, "http") as (dataplane, stop, listening):
        api = HttpApi(dataplane, HttpOptions(
            server_name=opts.get("server_name", "triton"),
            strict_readiness=opts.get("strict_readiness", True),
            max_input_size=opts.get("http_max_input_size", 1 << 26),
            restricted={k: tuple(v) for k, v in (opts.get("http_restricted") or {}).items()},
        ))
        serve = serve_hypercorn if opts.get("http_server") == "hypercorn" else serve_uvicorn
        servers = [serve(api.app(), listen_socket(opts["http_address"], opts["http_port"]), stop)]
        if opts.get("metrics_port"):
            servers.append(serve_uvicorn(metrics_app(dataplane.client), listen_socket(
                opts.get("metrics_address") or opts["http_address"], opts["metrics_port"]), stop))
        listening()    # the sockets listen: connections queue until the servers accept them
        await asyncio.gather(*servers)


def main(argv: list[str]) -> int:
    opts = start_process(argv, "http")
    uvloop.run(run(opts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
