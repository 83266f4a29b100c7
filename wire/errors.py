"""Triton's error codes and the one error type every tritond process raises and sends.

A `TritonError` is what a client sees: a code (Triton's names) and a message. It is raised
inside each process and travels over ZeroMQ as itself (the schema encodes it as a pair), so
no layer translates between error forms; only the frontends map codes to HTTP statuses and
gRPC codes. This module imports nothing of ours, so every folder may use it.
"""
from __future__ import annotations

import enum


class Code(enum.Enum):
    """Triton's internal error codes (TRITONSERVER_Error_Code names)."""
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# What a request cancelled before it ran is answered with, wherever it waited.
REQUEST_CANCELLED = "request was cancelled"


class TritonError(Exception):
    """An error a client caused or must see."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TritonError) and other.code is self.code
                and other.message == self.message)

    def __hash__(self) -> int:
        return hash((self.code, self.message))


def invalid(message: str) -> TritonError:
    return TritonError(Code.INVALID_ARG, message)


def unavailable(message: str) -> TritonError:
    return TritonError(Code.UNAVAILABLE, message)


def not_found(message: str) -> TritonError:
    return TritonError(Code.NOT_FOUND, message)


def internal(message: str) -> TritonError:
    return TritonError(Code.INTERNAL, message)


def unsupported(message: str) -> TritonError:
    return TritonError(Code.UNSUPPORTED, message)


def request_prefix(request_id: str) -> str:
    """Triton's prefix on request errors: `[request id: <id>] ` (`<id_unknown>` without one)."""
    return f"[request id: {request_id or '<id_unknown>'}] "
