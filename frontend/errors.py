"""The one place that maps Triton's error codes to HTTP statuses and gRPC codes."""
from __future__ import annotations

from tritond.wire.errors import Code, TritonError

HTTP_STATUS = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.UNKNOWN: 400,
}

GRPC_CODE_NAME = {
    Code.INTERNAL: "INTERNAL",
    Code.NOT_FOUND: "NOT_FOUND",
    Code.UNAVAILABLE: "UNAVAILABLE",
    Code.UNSUPPORTED: "UNIMPLEMENTED",
    Code.INVALID_ARG: "INVALID_ARGUMENT",
    Code.ALREADY_EXISTS: "ALREADY_EXISTS",
    Code.CANCELLED: "CANCELLED",
    Code.UNKNOWN: "UNKNOWN",
}


def http_status(e: TritonError) -> int:
    return HTTP_STATUS.get(e.code, 500)
