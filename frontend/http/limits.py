"""Limits that keep slow or hostile HTTP clients from holding a frontend's memory and
connections: a bounded request head (size 431, field count 431), a deadline for the head and
one for the body (408, then the connection closes), an idle keep-alive timeout, and a cap on
open connections per process (503 and close, with a log line saying so).

uvicorn's httptools protocol enforces none of the head limits, so its protocol class is
extended here; all of them cost a counter or a timer handle per request. It also caps a chunked
body at Triton's 65,536 non-empty chunks (400), and takes a request that has both
`Transfer-Encoding: chunked` and `Content-Length` as Triton does, decoding the chunks and
ignoring the length, then closes the connection after the response (RFC 9112 section 6.3: such a
request may be an attempt at request smuggling, so no further request may follow it on the
same connection). hypercorn bounds the
head with h11's incomplete-event size and closes a connection that sends no complete head
within its keep-alive timeout; the header count and the body deadline are ASGI middleware
there, and its TCP server class is extended for the connection cap.
"""
from __future__ import annotations

import asyncio
import http
import logging
import os
import time
from typing import Any

import msgspec
import orjson

from tritond.wire.options import HttpLimitsConfig

log = logging.getLogger("tritond.http")

CAP_LOG_INTERVAL_S = 60.0
MAX_CHUNKS = 65536          # Triton's kMaxChunkedChunks
TOO_MANY_CHUNKS = (f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. "
                   f"Send fewer or larger HTTP chunks.")
DRAIN_SECS = 5.0            # how long a refused chunked body is still read (and dropped)
TIMER_SLACK_S = 0.001       # a timer may fire this much early (the loop's clock counts milliseconds)


class HttpLimits(HttpLimitsConfig, frozen=True):
    """The limits the options carry, with what a client is told at each."""

    @classmethod
    def from_options(cls, given: HttpLimitsConfig) -> "HttpLimits":
        return cls(**msgspec.structs.asdict(given))

    def head_too_large(self) -> str:
        return (f"request head is larger than {self.max_header_size} bytes "
                f"(--http-max-header-size)")

    def too_many_headers(self, count: int) -> str:
        return f"request has {count} header fields, more than {self.max_headers} (--http-max-headers)"

    def head_timeout(self) -> str:
        return (f"request head not received within {self.header_timeout_secs:g} s "
                f"(--http-header-timeout-secs)")

    def body_timeout(self) -> str:
        return f"request body not received within {self.body_timeout_secs:g} s (--http-body-timeout-secs)"


def raw_response(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, for the protocol layer."""
    body = orjson.dumps({"error": message})
    phrase = http.HTTPStatus(status).phrase
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class ConnectionCap:
    """Counts refusals at the cap; the log says so at once, then at most once a minute."""

    def __init__(self, limits: HttpLimits, server: str) -> None:
        self.limit = limits.max_connections
        self.server = server
        self.refused = 0
        self.next_log = 0.0
        self.message = (f"server has {self.limit} open connections (--http-max-connections); "
                        f"retry later")

    def refuse(self) -> bytes:
        self.refused += 1
        now = time.monotonic()
        if now >= self.next_log:
            log.warning("HTTP frontend (pid %d, %s) is at its cap of %d open connections "
                        "(--http-max-connections): refused %d new connection(s) with 503",
                        os.getpid(), self.server, self.limit, self.refused)
            self.refused = 0
            self.next_log = now + CAP_LOG_INTERVAL_S
        return raw_response(503, self.message)


class _LimitExceeded(Exception):
    pass


def uvicorn_protocol(base: type, limits: HttpLimits, cap: ConnectionCap) -> type:
    """`base` (uvicorn's HttpToolsProtocol, or a subclass) enforcing `limits`.

    The head and body deadlines share one timer per connection that is re-armed only when a
    deadline comes sooner than it fires: a request on a kept-alive connection moves the
    deadline, not a timer (a timer that fires early finds the deadline later and waits for it)."""
    max_header_size = limits.max_header_size
    max_headers = limits.max_headers
    head_seconds, head_late = limits.header_timeout_secs, limits.head_timeout()
    body_seconds, body_late = limits.body_timeout_secs, limits.body_timeout()

    class Limited(base):   # type: ignore[misc, valid-type]
        _timer: asyncio.TimerHandle | None = None
        _timer_at = 0.0                 # when _timer fires (loop time)
        _deadline: float | None = None  # when the armed limit expires; None: none is armed
        _late = ""                      # what the 408 says when it does
        _refusal: tuple[int, str] | None = None

        _in_head = False
        _unparsed = 0
        _chunks = 0
        _framing = 0            # bit 1: Transfer-Encoding chunked, bit 2: Content-Length
        _length = b""           # the Content-Length field's value (the body sink reads it)

        def connection_made(self, transport: asyncio.Transport) -> None:
            if len(self.connections) >= limits.max_connections:
                self.transport = transport        # what uvicorn's connection_lost closes
                self._refusal = (503, cap.message)
                transport.write(cap.refuse())
                transport.close()
                return
            super().connection_made(transport)
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
            self._in_head = True
            self._head_bytes = 0
            self._fields = 0
            self._arm(head_seconds, head_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def _arm(self, seconds: float, late: str) -> None:
            deadline = self.loop.time() + seconds
            self._deadline = deadline
            self._late = late
            timer = self._timer
            if timer is None or self._timer_at > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = self.loop.call_at(deadline, self._check)
                self._timer_at = deadline

        def _disarm(self) -> None:
            self._deadline = None       # the timer, when it fires, finds nothing armed

        def _check(self) -> None:
            self._timer = None
            deadline = self._deadline
            if deadline is None:
                return
            if self.loop.time() < deadline - TIMER_SLACK_S:
                self._timer = self.loop.call_at(deadline, self._check)
                self._timer_at = deadline
                return
            self._deadline = None
            self._expired(self._late)

        def _expired(self, message: str) -> None:
            if self.transport.is_closing():
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(raw_response(408, message))
            self.transport.close()

        def _refuse(self, status: int, message: str) -> None:
            """Stop parsing (httptools turns this into a parse error, answered below)."""
            self._refusal = (status, message)
            raise _LimitExceeded(message)

        def _reply(self, status: int, message: str) -> None:
            self._refusal = (status, message)
            self._disarm()
            self.transport.write(raw_response(status, message))
            if message == TOO_MANY_CHUNKS and self.transport.can_write_eof():
                # The client is likely still sending chunks: closing now could reset the
                # connection before it reads the answer, so the rest is read and dropped.
                self.transport.write_eof()
                self.loop.call_later(DRAIN_SECS, self.transport.close)
            else:
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a parse error; one of the limits caused it when set."""
            self._reply(*(self._refusal or (400, msg)))

        def data_received(self, data: bytes) -> None:
            if self._refusal is not None:
                return
            if self._in_head:
                self._unparsed += len(data)
            super().data_received(data)
            # A head that grows without completing a field is cut here; completed fields
            # are counted in on_url/on_header.
            if self._in_head and self._refusal is None and self._unparsed > max_header_size:
                self._reply(431, limits.head_too_large())

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._chunks = 0
            self._framing = 0
            self._in_head = True
            self._head_bytes = 0
            self._fields = 0
            if self._deadline is None:
                self._arm(head_seconds, head_late)

        def on_url(self, url: bytes) -> None:
            self._unparsed = 0
            self._head_bytes += len(url)
            if self._head_bytes > max_header_size:
                self._refuse(431, limits.head_too_large())
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            """Counts the field and its bytes, notes the framing, then does what uvicorn's
            on_header does (one lowercasing for both)."""
            name = name.lower()
            if name == b"content-length":
                self._framing |= 2
                self._length = value
            elif name == b"transfer-encoding":
                if b"chunked" in value.lower():
                    self._framing |= 1
            elif name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            self._fields += 1
            if self._fields > max_headers:
                self._refuse(431, limits.too_many_headers(self._fields))
            self._unparsed = 0
            self._head_bytes += len(name) + len(value) + 4
            if self._head_bytes > max_header_size:
                self._refuse(431, limits.head_too_large())
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._unparsed = 0
            self._arm(body_seconds, body_late)
            super().on_headers_complete()
            if self._framing == 3 and self.cycle is not None:
                self.cycle.keep_alive = False

        def on_chunk_header(self) -> None:
            self._chunks += 1

        def on_body(self, body: bytes) -> None:
            if self._chunks > MAX_CHUNKS:       # a data chunk beyond the cap (the last, empty one has no body)
                self._refuse(400, TOO_MANY_CHUNKS)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._deadline = None
            super().on_message_complete()

    return Limited


class RequestLimits:
    """ASGI middleware for servers that do not count header fields or time the body read
    themselves (hypercorn): 431 beyond --http-max-headers, 408 when the body is late; a request
    with both Transfer-Encoding and Content-Length (h11 decodes the chunks) is answered with
    `connection: close`."""

    def __init__(self, app: Any, limits: HttpLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        count = len(scope["headers"])
        if count > self.limits.max_headers:
            await _reply(send, 431, self.limits.too_many_headers(count))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_secs
        state = {"body": True, "answered": False}

        async def timed_receive() -> dict:
            if state["answered"]:
                return {"type": "http.disconnect"}
            if not state["body"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                state["answered"] = True
                await _reply(send, 408, self.limits.body_timeout())
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body"] = False
            return message

        names = {name for name, _ in scope["headers"]}
        close = b"transfer-encoding" in names and b"content-length" in names

        async def guarded_send(message: dict) -> None:
            if close and message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (b"connection", b"close")])
            if not state["answered"]:
                await send(message)

        await self.app(scope, timed_receive, guarded_send)


async def _reply(send: Any, status: int, message: str) -> None:
    body = orjson.dumps({"error": message})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def cap_hypercorn(limits: HttpLimits, cap: ConnectionCap) -> None:
    """Cap hypercorn's open connections. Its serve() builds a TCPServer per connection from
    the name in hypercorn.asyncio.run, with no hook, so that name is replaced by a subclass
    that refuses beyond the cap (this process runs one hypercorn server)."""
    from hypercorn.asyncio import run as hypercorn_run
    from hypercorn.asyncio.tcp_server import TCPServer

    class CappedTCPServer(TCPServer):
        open_connections = 0

        async def run(self) -> None:
            if CappedTCPServer.open_connections >= limits.max_connections:
                try:
                    self.writer.write(cap.refuse())
                    self.writer.close()
                except OSError:
                    pass
                return
            CappedTCPServer.open_connections += 1
            try:
                await super().run()
            finally:
                CappedTCPServer.open_connections -= 1

    hypercorn_run.TCPServer = CappedTCPServer
