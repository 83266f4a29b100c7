#!/usr/bin/env python3
"""A bare grpc.aio server (on uvloop, as tritond's gRPC frontend) whose ModelInfer answers each
request with its own bytes: registered without (de)serializers, the handler is handed the
message as one bytes object and returns it, so what it costs per byte is grpcio's own floor,
the least any gRPC frontend on grpcio can spend. malloc is set up as in tritond's gRPC frontend
(shm/heap.py), so the floor counts copies, not page faults. perf/bench_copies.py --cases
grpc-floor measures it beside tritond.

  python perf/grpc_echo.py PORT
"""
from __future__ import annotations

import asyncio
import sys

import grpc
import uvloop

from tritond.shm.heap import keep_large_allocations

METHOD = "/inference.GRPCInferenceService/ModelInfer"
OPTIONS = [("grpc.max_send_message_length", (1 << 31) - 1), ("grpc.max_receive_message_length", (1 << 31) - 1)]


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def serve(port: int) -> None:
    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    keep_large_allocations()
    uvloop.run(serve(int(sys.argv[1])))
