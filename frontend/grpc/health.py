"""`grpc.health.v1.Health/Check`: SERVING while the server is ready, as Triton answers it.

Both messages have a single field, so they are encoded here rather than pulling in the
optional grpcio-health-checking package; the requested service name does not matter.
"""
from __future__ import annotations

import grpc

from .servicer import InferenceServicer

# HealthCheckResponse{status = 1 (field 1, varint)} / {status = 2}
SERVING = b"\x08\x01"
NOT_SERVING = b"\x08\x02"


def health_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await servicer.admit(context, "health")
        return SERVING if servicer.ready() else NOT_SERVING

    return grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)})
