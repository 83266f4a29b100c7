"""Triton's test-only environment hook for the gRPC frontend, which its qa suites set to make
client timeouts deterministic. Not meant for production; logged when set.

- TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC=<n>: every RPC but ModelInfer and
  ModelStreamInfer waits <n> seconds before it is handled (L0_client_timeout's non-inference
  deadlines).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tritond.grpc")

GRPC_RESPONSE_DELAY = "TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC"


def grpc_response_delay_s() -> int:
    """Seconds each non-inference RPC waits (0: none)."""
    raw = os.environ.get(GRPC_RESPONSE_DELAY)
    if raw is None:
        return 0
    try:
        n = max(int(raw.strip()), 0)
    except ValueError:          # as Triton's atoi: not a number delays nothing
        n = 0
    log.info("%s=%s (test only): every non-inference gRPC call waits %d s", GRPC_RESPONSE_DELAY, raw, n)
    return n
