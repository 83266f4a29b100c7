"""Entry point of a gRPC frontend process (grpc.aio).

`python -m tritond.frontend.grpc.server <options-json>`. Several of these may listen on one
port (SO_REUSEPORT). SIGTERM stops new RPCs (UNAVAILABLE), lets in-flight ones finish
within the exit timeout, then closes the server.
"""
from __future__ import annotations

import asyncio
import logging
import sys

import grpc
from tritonclient.grpc import service_pb2_grpc

from ..process import frontend_dataplane, start_process
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


def bind_address(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}"


async def run(opts: dict) -> None:
    async with frontend_dataplane(opts, "grpc") as (dataplane, stop, listening):
        servicer = InferenceServicer(dataplane, GrpcOptions(
            server_name=opts.get("server_name", "triton"),
            strict_readiness=opts.get("strict_readiness", True),
            restricted={k: tuple(v) for k, v in (opts.get("grpc_restricted") or {}).items()},
        ))
        server = grpc.aio.server(options=SERVER_OPTIONS)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        server.add_generic_rpc_handlers((health_handler(servicer),))
        server.add_insecure_port(bind_address(opts["grpc_address"], opts["grpc_port"]))
        await server.start()
        listening()
        await stop.wait()
        await servicer.drain(float(opts.get("exit_timeout_secs", 30)))
        await server.stop(STOP_GRACE_S)


def main(argv: list[str]) -> int:
    opts = start_process(argv, "grpc")
    try:
        asyncio.run(run(opts))
    except RuntimeError as e:
        log.error("gRPC frontend failed: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
