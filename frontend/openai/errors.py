"""The errors of the OpenAI routes, answered as Triton's frontend answers them: FastAPI's
`{"detail": "<message>"}` with the status, 400 for what the client asked wrongly."""
from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def client_error(message: str) -> ApiError:
    return ApiError(400, message)


def server_error(message: str) -> ApiError:
    return ApiError(500, message)
