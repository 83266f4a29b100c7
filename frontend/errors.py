"""Triton error codes and the one place that maps them to HTTP statuses and gRPC codes."""
from __future__ import annotations

HTTP_STATUS = {
    "INTERNAL": 500,
    "NOT_FOUND": 404,
    "UNAVAILABLE": 503,
    "UNSUPPORTED": 501,
    "INVALID_ARG": 400,
    "ALREADY_EXISTS": 400,
    "CANCELLED": 400,
    "UNKNOWN": 400,
}

GRPC_CODE_NAME = {
    "INTERNAL": "INTERNAL",
    "NOT_FOUND": "NOT_FOUND",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNSUPPORTED": "UNIMPLEMENTED",
    "INVALID_ARG": "INVALID_ARGUMENT",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "CANCELLED": "CANCELLED",
    "UNKNOWN": "UNKNOWN",
}


class TritonError(Exception):
    """An error a client caused or must see, carrying Triton's code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def invalid(message: str) -> TritonError:
    return TritonError("INVALID_ARG", message)
