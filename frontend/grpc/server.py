"""Entry point of a gRPC frontend process (grpc.aio).

`python -m tritond.frontend.grpc.server <options-json>`. Several of these may listen on one
port (SO_REUSEPORT). SIGTERM stops new RPCs (UNAVAILABLE), lets in-flight ones finish
within the exit timeout, then closes the server.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

import grpc
from tritonclient.grpc import service_pb2_grpc

from tritond.broker.addresses import Addresses
from tritond.broker.process import die_with_parent, setup_logging
from tritond.shm.arena import Arena
from tritond.shm.mapping import SegmentMaps

from ..broker_client import BrokerClient
from ..dataplane import Dataplane
from .health import health_handler
from .servicer import GrpcOptions, InferenceServicer

log = logging.getLogger("tritond.grpc")

MAX_MESSAGE = (1 << 31) - 1
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 1),
]
# Streams left open by clients are cut this long after in-flight work has drained.
STOP_GRACE_S = 2.0
# The port opens once the broker's model table has arrived, so the first RPC sees a live server.
TABLE_WAIT_S = 30.0


def bind_address(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}"


async def run(opts: dict) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    client = BrokerClient(Addresses(opts["run_dir"]).frontends, "grpc")
    await client.start()
    if not await client.wait_table(TABLE_WAIT_S):
        log.warning("no model table from the broker after %gs; serving anyway", TABLE_WAIT_S)
    arena = Arena(opts["server_id"], f"f{os.getpid()}")
    maps = SegmentMaps()
    client.on_gone = maps.drop_prefix
    servicer = InferenceServicer(Dataplane(client, arena, maps), GrpcOptions(
        server_name=opts.get("server_name", "triton"),
        strict_readiness=opts.get("strict_readiness", True),
        restricted={k: tuple(v) for k, v in (opts.get("grpc_restricted") or {}).items()},
    ))
    server = grpc.aio.server(options=SERVER_OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((health_handler(servicer),))
    try:
        server.add_insecure_port(bind_address(opts["grpc_address"], opts["grpc_port"]))
        await server.start()
        await stop.wait()
        await servicer.drain(float(opts.get("exit_timeout_secs", 30)))
        await server.stop(STOP_GRACE_S)
    finally:
        client.close()
        maps.close()
        arena.close()


def main(argv: list[str]) -> int:
    opts = json.loads(argv[1])
    die_with_parent(opts["supervisor_pid"], signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(int(opts.get("log_verbose", 0)), "grpc")
    try:
        asyncio.run(run(opts))
    except RuntimeError as e:
        log.error("gRPC frontend failed: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
