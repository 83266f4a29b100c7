"""Flags bounding what one client connection may hold: HTTP head size, header count and
read timeouts, idle keep-alive, open connections per frontend process; gRPC keepalive
enforcement (tritonserver's flags, in milliseconds) and concurrent streams per connection.

Defaults are tritonserver's for its flags, and for ours values no well-behaved client meets.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tritond.wire.options import HttpLimitsConfig

_HTTP = HttpLimitsConfig()
# (flag, default, metavar, help); every one must be a positive number
HTTP_LIMITS = (
    ("--http-max-header-size", _HTTP.max_header_size, "BYTES",
     "largest request head (request line and headers) an HTTP client may send; more is answered 431"),
    ("--http-max-headers", _HTTP.max_headers, "N", "most header fields in one HTTP request; more is answered 431"),
    ("--http-header-timeout-secs", _HTTP.header_timeout_secs, "SECS",
     "a request head must arrive within this long of the connection opening or the request starting (408)"),
    ("--http-body-timeout-secs", _HTTP.body_timeout_secs, "SECS",
     "a request body must arrive within this long of its head (408)"),
    ("--http-keepalive-timeout-secs", _HTTP.keepalive_timeout_secs, "SECS",
     "an idle keep-alive HTTP connection is closed after this long"),
    ("--http-max-connections", _HTTP.max_connections, "N",
     "open HTTP connections per frontend process; a new one beyond this is answered 503 and closed"),
)
GRPC_KEEPALIVE = (
    # tritonserver flag, gRPC channel argument, default, metavar, help
    ("--grpc-keepalive-time", "grpc.keepalive_time_ms", 7200000, "MS",
     "ping an idle connection this often"),
    ("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 20000, "MS",
     "close a connection whose ping is not answered within this long"),
    ("--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 2, "COUNT",
     "pings the server may send while no data is sent (0: no limit)"),
    ("--grpc-http2-min-recv-ping-interval-without-data", "grpc.http2.min_ping_interval_without_data_ms", 300000,
     "MS", "least time between a client's pings while no data is sent; closer ones are strikes"),
    ("--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 2, "COUNT",
     "strikes before the connection is closed (0: no limit)"),
    ("--grpc-max-connection-age", "grpc.max_connection_age_ms", 0, "MS",
     "close a connection after this long (0: never)"),
    ("--grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", 0, "MS",
     "time calls on a connection closed for its age may finish (0: no limit)"),
)
GRPC_MAX_STREAMS = 1024


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_arguments(p: argparse.ArgumentParser, boolean: Callable[[str], bool]) -> None:
    for flag, default, metavar, text in HTTP_LIMITS:
        p.add_argument(flag, type=type(default), default=default, metavar=metavar, help=f"{text} (default {default})")
    for flag, _, default, metavar, text in GRPC_KEEPALIVE:
        p.add_argument(flag, type=int, default=default, metavar=metavar, help=f"{text} (default {default})")
    p.add_argument("--grpc-keepalive-permit-without-calls", type=boolean, nargs="?", const=True, default=False,
                   metavar="BOOL", help="as tritonserver: allow keepalive pings on a connection without calls")
    p.add_argument("--grpc-max-concurrent-streams", type=int, default=GRPC_MAX_STREAMS, metavar="N",
                   help=f"concurrent RPCs on one gRPC connection (default {GRPC_MAX_STREAMS})")


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The limits as server options; ValueError names a flag with a value out of range."""
    http = {}
    for flag, _, _, _ in HTTP_LIMITS:
        value = getattr(args, _dest(flag))
        if not value > 0:
            raise ValueError(f"{flag} must be greater than 0, got {value}")
        http[_dest(flag).removeprefix("http_")] = value
    grpc = []
    for flag, arg, *_ in GRPC_KEEPALIVE:
        value = getattr(args, _dest(flag))
        if value < 0:
            raise ValueError(f"{flag} must not be negative, got {value}")
        if value or not arg.startswith("grpc.max_connection_age"):   # 0: no maximum age, as tritonserver
            grpc.append((arg, value))
    grpc.append(("grpc.keepalive_permit_without_calls", int(bool(args.grpc_keepalive_permit_without_calls))))
    if args.grpc_max_concurrent_streams <= 0:
        raise ValueError(f"--grpc-max-concurrent-streams must be greater than 0, got {args.grpc_max_concurrent_streams}")
    grpc.append(("grpc.max_concurrent_streams", args.grpc_max_concurrent_streams))
    return {"http_limits": http, "grpc_channel_args": grpc}
