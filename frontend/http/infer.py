"""POST /v2/models/{model}[/versions/{version}]/infer as a raw ASGI app: the hot path.

No Starlette Request, Response or router: the headers are read once into a dict, the body is
parsed in one call that returns the finished request, the model a path names is resolved once
per model table (the broker publishes a new table on every change), and the response head is
built from pre-encoded lines. On uvicorn (the `send` handed in is its RequestResponseCycle's)
the whole response goes out in one transport write, as uvicorn's send() would have written it
in two, large binary outputs straight from the worker's shared memory; elsewhere (hypercorn,
or a connection whose writes are paused) through ASGI `send`. A large binary request body is
already in the frontend's arena when the route runs (sink.py).
Error responses take the framework's path: they are not the hot path.
"""
from __future__ import annotations

import logging
import re
import time
import zlib
from functools import partial
from typing import Any, Awaitable, Callable

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from tritond import logs
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid

from ..dataplane import Dataplane
from ..errors import http_status
from ..header_forward import HeaderForward
from ..tracing import Pending
from .body import UnsupportedEncoding, held_body, read_body
from .codec import parse_infer, response_parts
from .disconnect import until_disconnect
from .sink import SCOPE_KEY as SINK_KEY, BodySink, until_complete

try:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _UvicornCycle
except ImportError:     # pragma: no cover - uvicorn is a dependency; hypercorn alone still works
    _UvicornCycle = None

log = logging.getLogger("tritond.http")

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")
MAX_CACHED_PATHS = 4096     # distinct infer paths remembered (a client may spell versions many ways)
JOIN_MAX = 1 << 16          # up to this body size, head and body are joined into one buffer

_STATUS_200 = b"HTTP/1.1 200 OK\r\n"
_JSON = b"content-type: application/json\r\n"
_BINARY = b"content-type: application/octet-stream\r\n"
_END = b"\r\n"
_CLOSE_END = b"connection: close\r\n\r\n"


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def error_response(e: TritonError) -> Response:
    response = json_response({"error": e.message}, http_status(e))
    if isinstance(e, UnsupportedEncoding):
        response.headers["Accept-Encoding"] = "gzip, deflate"
    return response


def parse_header_length(value: str) -> int:
    """Inference-Header-Content-Length as C++ std::stoi reads it (leading digits, int32 range)."""
    text = value.lstrip()
    sign_len = 1 if text[:1] in ("+", "-") else 0
    end = sign_len
    while end < len(text) and text[end] in "0123456789":
        end += 1
    if end == sign_len:
        raise invalid(f"Unable to parse Inference-Header-Content-Length, got: {value}")
    n = int(text[:end])
    if not -(1 << 31) <= n < (1 << 31):
        raise invalid(f"Unable to parse Inference-Header-Content-Length, value is out of range "
                      f"[ {-(1 << 31)}, {(1 << 31) - 1} ], got: {value}")
    return n


def choose_encoding(accept: str) -> str:
    """Pick identity/deflate/gzip by the client's q-weights (Triton's rule)."""
    best, best_q = "identity", 0.0
    for part in accept.split(","):
        bits = part.strip().split(";")
        name = bits[0].strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        for b in bits[1:]:
            b = b.strip()
            if b.startswith("q="):
                try:
                    q = float(b[2:])
                except ValueError:
                    q = 0.0
        if q > best_q:
            best, best_q = name, q
    return best


def gzip_compress(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _held_body(cycle: Any) -> bytearray | None:
    """The body uvicorn's cycle already holds whole (the common small request), taken as its
    receive() would take it; None when it must come through receive() (more to read, a 100
    Continue to send, the client gone)."""
    if cycle.more_body or cycle.waiting_for_100_continue or cycle.disconnected or cycle.response_complete:
        return None
    body = cycle.body
    cycle.body = bytearray()
    cycle.message_event.clear()
    cycle.flow.resume_reading()
    return body


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class InferRoute:
    """The infer route of one HttpApi; also the endpoint of its Starlette routes (which then
    only ever answer other methods with 405)."""

    def __init__(self, dp: Dataplane, max_input_size: int, restriction: tuple[str, str] | None,
                 subjects: Any, client_certificate: Callable[[Scope], bytes | None] | None,
                 forward: HeaderForward | None = None) -> None:
        self.dp = dp
        self.client = dp.client
        self.limit = max_input_size
        self.restriction = (restriction[0].lower().encode("latin-1"), restriction[1]) if restriction else None
        self.rule = subjects
        self.client_certificate = client_certificate
        self.guarded = self.restriction is not None or subjects is not None   # else no check per request
        self.forward = forward
        self._targets: dict[str, tuple[str, int]] = {}     # path -> (model, version)
        self._table: Any = None                            # the model table _entries were resolved in
        self._entries: dict[str, S.ModelEntry] = {}        # path -> entry, for that table
        self._defaults: Any = None                         # uvicorn's default headers, as last encoded
        self._head: bytes = _STATUS_200                    # status line and those headers, encoded

    def target(self, path: str) -> tuple[str, int] | None:
        """(model, version or -1) of an infer path, None for any other path."""
        target = self._targets.get(path)
        if target is None:
            match = INFER_PATH.fullmatch(path)
            if match is None:
                return None
            version = match.group(2)
            target = (match.group(1), int(version) if version is not None else -1)
            if len(self._targets) >= MAX_CACHED_PATHS:
                self._targets.clear()
            self._targets[path] = target
        return target

    def entry(self, path: str, name: str, version: int) -> S.ModelEntry:
        """The model version the path's requests go to, resolved once per model table."""
        table = self.client.table
        if table is not self._table:
            self._table = table
            self._entries = {}
        entry = self._entries.get(path)
        if entry is None:
            entry = self.dp.entry(name, version)
            if len(self._entries) >= MAX_CACHED_PATHS:
                self._entries.clear()
            self._entries[path] = entry
        return entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.target(scope["path"])
        if target is None:
            await json_response({"error": "Not Found"}, 404)(scope, receive, send)
            return
        await self.serve(scope, receive, send, target)

    async def serve(self, scope: Scope, receive: Receive, send: Send, target: tuple[str, int]) -> None:
        sink = scope.get(SINK_KEY)      # the body the protocol writes into the arena, if it does
        try:
            headers = dict(reversed(scope["headers"]))      # the first of repeated fields wins, as in Starlette
            if self.guarded:
                refusal = self._refusal(scope, headers)
                if refusal is not None:
                    await refusal(scope, receive, send)
                    return
            try:
                traced = await self._infer(scope, receive, send, headers, target, sink)
            except TritonError as e:
                log.debug("%s %s failed: %s", scope["method"], scope["path"], e.message)
                await error_response(e)(scope, receive, send)
                return
            except ClientDisconnect:
                await Response(status_code=400)(scope, receive, send)
                return
            except Exception:
                log.exception("unexpected error handling %s %s", scope["method"], scope["path"])
                await json_response({"error": "internal error while handling the request"}, 500)(
                    scope, receive, send)
                return
            if traced is not None:
                self.dp.tracer.finish(*traced)
        finally:
            if sink is not None:
                sink.release()

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> Response | None:
        restriction = self.restriction
        if restriction is not None and _latin1(headers.get(restriction[0])) != restriction[1]:
            return json_response({"error": f"This API is restricted, expecting header "
                                           f"'{restriction[0].decode('latin-1')}'"}, 403)
        rule = self.rule
        if rule is not None and not rule.admits(
                self.client_certificate(scope) if self.client_certificate else None):
            return json_response({"error": "This API is restricted to clients with an authorized certificate "
                                           "subject"}, 403)
        return None

    async def _infer(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes],
                     target: tuple[str, int], sink: BodySink | None) -> tuple | None:
        """Serve one request; returns what the tracer finishes with once it was sent (None when
        the request is not traced). A body the protocol writes into the arena (`sink`) is
        parsed there, and its tensors go to the broker where they lie."""
        name, version = target
        client = self.client
        mode = client.trace_mode(name) if client.tracing else ""
        pending = Pending("HTTP", mode, _latin1(headers.get(b"traceparent")) or "") if mode else None
        entry = self.entry(scope["path"], name, version)
        header = headers.get(b"inference-header-content-length")
        if header is not None:
            header = header.decode("latin-1")
        encoding = headers.get(b"content-encoding")
        encoding = encoding.decode("latin-1").strip().lower() if encoding else ""
        cycle = getattr(send, "__self__", None)
        held = _held_body(cycle) if type(cycle) is _UvicornCycle and sink is None else None
        origin = None
        if sink is not None:
            await until_complete(sink, receive)
            body = sink.view
            origin = (sink.segment, sink.base)
        elif held is not None:
            body = held_body(held, encoding, headers.get(b"content-length"), self.limit, True, header)
        else:
            body = await read_body(receive, encoding, headers.get(b"content-length"), self.limit, True, header)
        header_len = None
        if header is not None:
            header_len = parse_header_length(header)
            if header_len < 0 or header_len > len(body):
                raise invalid(f"inference header size should be in range (0, {len(body)}), got: {header}")
        view = entry.view
        if view is not None and view.decoupled:
            raise TritonError(Code.UNSUPPORTED, "HTTP end point doesn't support models with decoupled transaction policy")
        opts, inputs, outputs, default_binary = parse_infer(body, header_len, name, view, self.limit, origin)
        if self.forward is not None:
            opts.params.update(self.forward.parameters(
                [(k.decode("latin-1"), v) for k, v in scope["headers"]]))
        request_id = opts.id
        if request_id:
            logs.REQUEST_ID.set(request_id)      # this request's task: its log lines carry the id
        if pending is not None:
            opts.trace = pending.start()
            opts.on_cancelled = partial(self.dp.tracer.cancelled, pending, name, request_id)
        result = await until_disconnect(receive, self.dp.infer(entry, inputs, outputs, opts,
                                                               sink.take() if sink is not None else None))
        info = result.reply.trace if result.reply is not None else None
        try:
            body_out, blobs = response_parts(result, default_binary)
            json_len = len(body_out) if blobs else None
            accept = headers.get(b"accept-encoding")
            encoding_out = choose_encoding(accept.decode("latin-1")) if accept else "identity"
            direct = (type(cycle) is _UvicornCycle and not cycle.response_started and not cycle.flow.write_paused
                      and not cycle.access_log)
            if blobs and (not direct or encoding_out != "identity" or scope["scheme"] != "http"
                          or sum([len(b) for b in blobs]) <= JOIN_MAX):
                # TLS encrypts (copies) what it is given anyway, and its transport's flow control
                # cannot say when it holds nothing more (it pauses at zero bytes buffered)
                body_out, blobs = b"".join([body_out, *blobs]), []
            if not blobs:
                self.dp.release(result)
            if encoding_out == "gzip":
                body_out = gzip_compress(body_out)
            elif encoding_out == "deflate":
                body_out = zlib.compress(body_out)
            sent = time.monotonic_ns() if info is not None else 0
            if direct:
                self._write(cycle, body_out, blobs, json_len, encoding_out)
                if blobs and cycle.flow.write_paused:
                    await cycle.flow.drain()     # the outputs are on their way only once the socket took them
            else:
                await self._send(send, body_out, json_len, encoding_out)
        finally:
            self.dp.release(result)
        if info is None:
            return None
        return info, pending, entry.name, result.model_version, request_id, sent, time.monotonic_ns()

    def _write(self, cycle: Any, body: bytes, blobs: list[memoryview], json_len: int | None,
               encoding: str) -> None:
        """The whole response on uvicorn's cycle, as its send() writes a start message (its
        default headers first, `connection: close` when the connection ends) and one final
        body message, in one write. `blobs`, large outputs that follow `body` (their views of
        the worker's shared memory), go to a clear-text transport as they are: it is told to
        call for a pause until it has passed every byte to the socket, so the caller can wait
        for that before the outputs are released."""
        if cycle.disconnected:
            return                  # what uvicorn's send() does for a client that is gone
        defaults = cycle.default_headers
        if defaults is not self._defaults:      # uvicorn renews them (the date) once a second
            self._head = _STATUS_200 + b"".join([b"%b: %b\r\n" % (k, v) for k, v in defaults])
            self._defaults = defaults
        keep_alive = cycle.keep_alive
        end = _END if keep_alive else _CLOSE_END
        size = len(body) + sum([len(b) for b in blobs]) if blobs else len(body)
        if json_len is None and encoding == "identity":
            head = b"%bcontent-length: %d\r\n%b%b" % (self._head, size, _JSON, end)
        else:
            lines = [self._head]
            if json_len is not None:
                lines.append(b"inference-header-content-length: %d\r\n" % json_len)
            if encoding != "identity":
                lines.append(b"content-encoding: %b\r\n" % encoding.encode())
            lines += [b"content-length: %d\r\n" % size, _JSON if json_len is None else _BINARY, end]
            head = b"".join(lines)
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        transport = cycle.transport
        if blobs:
            transport.set_write_buffer_limits(0)
            transport.writelines([head + body, *blobs])
        elif len(body) <= JOIN_MAX:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            transport.close()
        cycle.on_response()

    @staticmethod
    async def _send(send: Send, body: bytes, json_len: int | None, encoding: str) -> None:
        headers = []
        if json_len is not None:
            headers.append((b"inference-header-content-length", str(json_len).encode()))
        if encoding != "identity":
            headers.append((b"content-encoding", encoding.encode()))
        headers.append((b"content-length", str(len(body)).encode()))
        headers.append((b"content-type", b"application/json" if json_len is None else b"application/octet-stream"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
