"""What every frontend process does around its protocol server: connect to the broker,
wait for its model table, own a shared-memory arena and mappings, stop on SIGTERM, and
clean up on the way out."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import AsyncIterator, Callable

from tritond.process import die_with_parent, setup_logging
from tritond.repository.remote import is_remote
from tritond.shm.arena import Arena
from tritond.shm.mapping import SegmentMaps
from tritond.wire import options as wire_options
from tritond.wire.addresses import Addresses
from tritond.wire.options import ServerOptions

from .broker_client import BrokerClient
from .brokers import Brokers
from .dataplane import Dataplane
from .tracing import FrontendTracer
from .readiness import SupervisorLink

log = logging.getLogger("tritond.frontend")

TABLE_WAIT_S = 30.0


def start_process(argv: list[str], role: str) -> ServerOptions:
    """Decode the options the supervisor passed, die with it, leave SIGINT to it."""
    opts = wire_options.decode(argv[1])
    die_with_parent(opts.supervisor_pid, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)      # log reopening comes by message
    setup_logging(opts.log_verbose, role, opts.log)
    return opts


def _nothing_to_reload() -> None:
    log.info("SIGHUP: no TLS certificate to reload")


@contextlib.asynccontextmanager
async def frontend_dataplane(opts: ServerOptions, kind: str, on_hangup: Callable[[], object] | None = None
                             ) -> AsyncIterator[tuple[Dataplane, asyncio.Event, Callable[[], None]]]:
    """The dataplane a protocol server serves with, the event SIGTERM sets, and what to call
    once its port is open. The server opens its port only after this, once the broker's
    model table has arrived, so the first request sees a live server; it answers ready only
    when the supervisor says every frontend process is serving. SIGHUP calls `on_hangup` (a
    certificate reload); the process started with SIGHUP blocked, and one that arrived
    meanwhile is delivered now."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGHUP, on_hangup or _nothing_to_reload)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    client: BrokerClient | Brokers = (BrokerClient(Addresses(opts.run_dir).frontends, kind) if opts.broker_shards == 1
                                      else Brokers(opts.run_dir, kind, opts.broker_shards))
    client.serving = False
    link = SupervisorLink(opts.ready_fd, lambda: setattr(client, "serving", True))
    await client.start()
    if not await client.wait_table(TABLE_WAIT_S):
        log.warning("no model table from the broker after %gs; serving anyway", TABLE_WAIT_S)
    arena = Arena(opts.server_id, f"f{os.getpid()}")
    maps = SegmentMaps()
    client.on_gone = maps.drop_prefix
    tracer = FrontendTracer(client, opts.trace.otel)
    if opts.trace.mode == "opentelemetry":
        tracer.start_exporter()     # as tritonserver: its batch span processor runs from startup
    try:
        # Only explicit mode loads after startup: elsewhere a load request must not fetch anything.
        explicit = opts.model_control_mode == "explicit"
        remote = [r for r in opts.model_repositories if is_remote(r)] if explicit else []
        overrides = (opts.run_dir, opts.model_file_override_max_bytes) if explicit else None
        yield Dataplane(client, arena, maps, remote, tracer, overrides), stop, link.listening
    finally:
        tracer.close()
        link.close()
        client.close()
        maps.close()
        arena.close()
