"""The KServe v2 / Triton HTTP API as one Starlette app."""
from __future__ import annotations

import base64
import logging
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import msgspec
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tritond import logs
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid

from ..client_subject import SubjectRule
from ..dataplane import Dataplane, split_parameters
from ..errors import http_status
from ..metadata import SERVER_VERSION, model_metadata
from ..tracing import Pending
from .codec import parse_infer, parse_json, render_response
from .disconnect import until_disconnect
from .generate import generate, generate_stream, parse_generate

_BAD_READY = "Invalid value for 'ready': expected a boolean"
# A repository index body whose 'ready' is an array or object (checked before parsing, so a
# deeply nested one is answered as Triton does rather than as a JSON nesting error).
_NESTED_READY = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


log = logging.getLogger("tritond.http")


@dataclass
class HttpOptions:
    server_name: str = "triton"
    strict_readiness: bool = True
    extensions: list[str] = field(default_factory=list)
    max_input_size: int = 1 << 26
    restricted: dict[str, tuple[str, str]] = field(default_factory=dict)   # category -> (header, value)
    subjects: dict[str, SubjectRule] = field(default_factory=dict)   # category -> certificate subjects
    client_certificate: Callable[[Scope], bytes | None] | None = None   # DER certificate of the client
    init_failed: bool = False       # started although a repository failed (--exit-on-error=false)


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


class UnsupportedEncoding(TritonError):
    """A Content-Encoding other than gzip/deflate/identity; the reply names the ones accepted."""

    def __init__(self) -> None:
        super().__init__(Code.UNSUPPORTED, "Unsupported compression type")


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


INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


class HttpApi:
    def __init__(self, dataplane: Dataplane, opts: HttpOptions) -> None:
        self.dp = dataplane
        self.client = dataplane.client
        self.opts = opts

    # ------------------------------------------------------------- plumbing

    def route(self, path: str, fn: Callable[[Request], Awaitable[Response]], methods: list[str],
              category: str) -> Route:
        return Route(path, self.guard(fn, category), methods=methods)

    def guard(self, fn: Callable[[Request], Awaitable[Response]], category: str
              ) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler: restricted-API check, Triton errors as JSON bodies, nothing escapes."""
        async def endpoint(request: Request) -> Response:
            restriction = self.opts.restricted.get(category)
            if restriction is not None and request.headers.get(restriction[0]) != restriction[1]:
                return json_response({"error": f"This API is restricted, expecting header '{restriction[0]}'"}, 403)
            rule = self.opts.subjects.get(category)
            if rule is not None and not rule.admits(
                    self.opts.client_certificate(request.scope) if self.opts.client_certificate else None):
                return json_response({"error": "This API is restricted to clients with an authorized certificate "
                                               "subject"}, 403)
            try:
                return await fn(request)
            except TritonError as e:
                return error_response(e)
            except ClientDisconnect:
                return Response(status_code=400)
            except Exception:
                log.exception("unexpected error handling %s %s", request.method, request.url.path)
                return json_response({"error": "internal error while handling the request"}, 500)
        return endpoint

    def _too_large(self, request: Request, size: int) -> TritonError:
        """Triton's wording for an oversized body depends on what the body holds."""
        limit = self.opts.max_input_size
        hint = "Use --http-max-input-size to increase the limit."
        header = request.headers.get("inference-header-content-length")
        if not request.url.path.endswith("/infer") or header is None:
            return invalid(f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} "
                           f"bytes. {hint}")
        if header.strip() == "0":
            return invalid(f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
                           f"{limit} bytes. {hint}")
        return invalid(f"request size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {hint}")

    async def body(self, request: Request) -> bytes | bytearray:
        """The request body, decompressed, never more than --http-max-input-size bytes."""
        limit = self.opts.max_input_size
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity", "gzip", "deflate"):
            raise UnsupportedEncoding()
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise self._too_large(request, int(declared))
        first: bytes = b""
        grown: bytearray | None = None     # a body of several chunks grows in place (no 2x join)
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise self._too_large(request, total)
            if grown is not None:
                grown += chunk
            elif first:
                grown = bytearray(first)
                grown += chunk
            else:
                first = chunk
        body = first if grown is None else grown
        if encoding in ("", "identity"):
            return body
        if not body:
            raise invalid("nothing to be decompressed")
        d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise invalid(f"failed to decompress the request body: {e}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise invalid(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
                          f"Use --http-max-input-size to increase the limit.")
        if not d.eof:
            raise invalid("failed to decompress the request body: the compressed stream is truncated")
        return out

    @staticmethod
    def version(request: Request) -> int:
        v = request.path_params.get("version")
        return int(v) if v is not None else -1

    # ------------------------------------------------------------- health and metadata

    async def live(self, request: Request) -> Response:
        """Live means this process serves: a broker restarting makes the server not ready,
        not dead (an orchestrator would otherwise restart a server that is recovering). A server
        whose initialization failed is never live, as Triton's."""
        return Response(status_code=400 if self.opts.init_failed else 200)

    async def ready(self, request: Request) -> Response:
        ok = not self.opts.init_failed and self.client.ready(self.opts.strict_readiness)
        return Response(status_code=200 if ok else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": self.opts.server_name, "version": SERVER_VERSION,
                              "extensions": self.opts.extensions})

    async def model_metadata(self, request: Request) -> Response:
        name = request.path_params["model"]
        version = self.version(request)
        entry = self.client.table.resolve(name, version)
        versions = [str(version)] if version >= 0 else sorted(
            (str(v) for v, e in self.client.table.by_name[name].items() if e.state is S.ModelState.READY), key=int)
        return json_response(model_metadata(entry.config or {}, name, versions))

    async def model_ready(self, request: Request) -> Response:
        name = request.path_params["model"]
        try:
            self.client.table.resolve(name, self.version(request))
        except TritonError as e:
            if e.code is Code.INVALID_ARG:
                raise
            return json_response({"error": "Model version not ready"}, 400)
        return Response(status_code=200)

    async def model_config(self, request: Request) -> Response:
        entry = self.client.table.any_entry(request.path_params["model"], self.version(request))
        return json_response(entry.config or {})

    async def model_stats(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        reply = await self.client.control(S.Statistics(name, self.version(request)))
        return json_response({"model_stats": msgspec.to_builtins(reply.model_stats)})

    # ------------------------------------------------------------- inference

    async def infer(self, request: Request) -> Response:
        name = request.path_params["model"]
        mode = self.client.trace_mode(name)
        pending = Pending("HTTP", mode, request.headers.get("traceparent", "")) if mode else None
        entry = self.dp.entry(name, self.version(request))
        body = await self.body(request)
        header = request.headers.get("inference-header-content-length")
        header_len = None
        if header is not None:
            header_len = parse_header_length(header)
            if header_len < 0 or header_len > len(body):
                raise invalid(f"inference header size should be in range (0, {len(body)}), got: {header}")
        if entry.view is not None and entry.view.decoupled:
            raise TritonError(Code.UNSUPPORTED, "HTTP end point doesn't support models with decoupled transaction policy")
        doc, inputs, outputs, default_binary = parse_infer(body, header_len, name, entry.view,
                                                           self.opts.max_input_size)
        request_id = doc.get("id", "")
        if not isinstance(request_id, str):
            raise invalid("Unable to parse 'id'")
        params = doc.get("parameters") or {}
        opts = split_parameters(params)
        opts.id = request_id
        if request_id:
            logs.REQUEST_ID.set(request_id)      # this request's task: its log lines carry the id
        if pending is not None:
            opts.trace = pending.start()
        result = await until_disconnect(request, self.dp.infer(entry, inputs, outputs, opts))
        info = result.reply.trace if result.reply is not None else None
        try:
            body_out, json_len = render_response(result, default_binary)
        finally:
            self.dp.release(result)
        headers = {}
        media = "application/json"
        if json_len is not None:
            headers["Inference-Header-Content-Length"] = str(json_len)
            media = "application/octet-stream"
        encoding = choose_encoding(request.headers.get("accept-encoding", ""))
        if encoding == "gzip":
            body_out = gzip_compress(body_out)
            headers["Content-Encoding"] = "gzip"
        elif encoding == "deflate":
            body_out = zlib.compress(body_out)
            headers["Content-Encoding"] = "deflate"
        response = Response(body_out, headers=headers, media_type=media)
        if info is not None:
            response.trace = (info, pending, entry.name, result.model_version, request_id)
        return response

    async def generate(self, request: Request) -> Response:
        return await generate(self.dp, request, *await self._generate_request(request))

    async def generate_stream(self, request: Request) -> Response:
        return await generate_stream(self.dp, request, *await self._generate_request(request))

    async def _generate_request(self, request: Request) -> tuple[S.ModelEntry, list, Any]:
        entry = self.dp.entry(request.path_params["model"], self.version(request))
        if request.headers.get("content-encoding", "").strip().lower() not in ("", "identity"):
            raise invalid("Unsupported content-encoding, only 'identity' is supported.")
        inputs, opts = parse_generate(await self.body(request), entry, self.opts.max_input_size)
        return entry, inputs, opts

    # ------------------------------------------------------------- repository

    async def index(self, request: Request) -> Response:
        body = await self.body(request)
        ready = False
        if body.strip():
            if _NESTED_READY.match(body):       # an array or object is never the boolean asked for
                raise invalid(_BAD_READY)
            doc = parse_json(body)
            if "ready" in doc:
                if not isinstance(doc["ready"], bool):
                    raise invalid(_BAD_READY)
                ready = doc["ready"]
        reply = await self.client.control(S.RepositoryIndex(ready))
        return json_response(msgspec.to_builtins(reply.models))

    async def load(self, request: Request) -> Response:
        if request.path_params.get("repo"):
            raise TritonError(Code.UNSUPPORTED, "'repository_name' specification is not supported")
        body = await self.body(request)
        params = parse_json(body).get("parameters", {}) if body.strip() else {}
        op = S.LoadModel(request.path_params["model"])
        files: dict[str, bytes] = {}
        if isinstance(params, dict):
            if "config" in params:
                config = params["config"]
                op.config = config if isinstance(config, str) else orjson.dumps(config).decode()
            for key, value in params.items():
                if key.startswith("file:"):
                    try:
                        files[key] = base64.b64decode(value, validate=True)
                    except (ValueError, TypeError):
                        raise invalid(f"failed to decode the base64 content of load parameter '{key}'") from None
        await self.dp.load_model(op, files)
        return Response(status_code=200)

    async def unload(self, request: Request) -> Response:
        if request.path_params.get("repo"):
            raise TritonError(Code.UNSUPPORTED, "'repository_name' specification is not supported")
        body = await self.body(request)
        params = parse_json(body).get("parameters", {}) if body.strip() else {}
        dependents = bool(params.get("unload_dependents", False)) if isinstance(params, dict) else False
        await self.client.control(S.UnloadModel(request.path_params["model"], dependents))
        return Response(status_code=200)

    # ------------------------------------------------------------- shared memory

    async def shm_status(self, request: Request) -> Response:
        reply = await self.client.control(S.ShmStatus(request.path_params.get("region", "")))
        return json_response(msgspec.to_builtins(reply.regions))

    async def shm_register(self, request: Request) -> Response:
        doc = parse_json(await self.body(request))
        key, offset, size = doc.get("key"), doc.get("offset", 0), doc.get("byte_size")
        if not isinstance(key, str):
            raise invalid("Unable to parse 'key'")
        for what, v in (("offset", offset), ("byte_size", size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise invalid(f"Unable to parse '{what}'")
        await self.client.control(S.ShmRegister(request.path_params["region"], key, offset, size))
        return Response(status_code=200)

    async def shm_unregister(self, request: Request) -> Response:
        await self.client.control(S.ShmUnregister(request.path_params.get("region", "")))
        return Response(status_code=200)

    async def cuda_status(self, request: Request) -> Response:
        reply = await self.client.control(S.CudaStatus(request.path_params.get("region", "")))
        return json_response(msgspec.to_builtins(reply.regions))

    async def cuda_register(self, request: Request) -> Response:
        name = request.path_params["region"]
        doc = parse_json(await self.body(request))
        raw = doc.get("raw_handle")
        if not isinstance(raw, dict) or "b64" not in raw:
            raise invalid("Shared memory register request has no 'raw_handle' field")
        try:
            handle = base64.b64decode(raw["b64"], validate=True)
        except (ValueError, TypeError):
            handle = b""
        device_id, size = doc.get("device_id", 0), doc.get("byte_size", 0)
        for what, v in (("device_id", device_id), ("byte_size", size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise invalid(f"failed to register shared memory region '{name}': invalid args")
        await self.client.control(S.CudaRegister(name, handle, device_id, size))
        return Response(status_code=200)

    async def cuda_unregister(self, request: Request) -> Response:
        await self.client.control(S.CudaUnregister(request.path_params.get("region", "")))
        return Response(status_code=200)

    # ------------------------------------------------------------- settings

    async def logging(self, request: Request) -> Response:
        settings = {}
        if request.method == "POST":
            settings = parse_json(await self.body(request))
        if not isinstance(settings, dict):
            raise invalid("log settings must be a JSON object")
        reply = await self.client.control(S.LogSettings(settings))
        return json_response(msgspec.to_builtins(reply.settings))

    async def trace(self, request: Request) -> Response:
        settings = {}
        if request.method == "POST":
            settings = parse_json(await self.body(request))
        model = request.path_params.get("model", "")
        if not isinstance(settings, dict):
            raise invalid("trace settings must be a JSON object")
        reply = await self.client.control(S.TraceSettings(model, settings))
        return json_response(msgspec.to_builtins(reply.settings))

    # ------------------------------------------------------------- app

    def app(self) -> ASGIApp:
        """Starlette serves every route; inference, the hot path, skips its router and
        middleware stack (about a tenth of the frontend's CPU per request)."""
        starlette = self.starlette()
        infer = self.guard(self.infer, "inference")
        pattern = INFER_PATH

        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "POST":
                match = pattern.fullmatch(scope["path"])
                if match is not None:
                    params = {"model": match.group(1)}
                    if match.group(2) is not None:
                        params["version"] = int(match.group(2))
                    scope["path_params"] = params
                    response = await infer(Request(scope, receive))
                    traced = getattr(response, "trace", None)
                    if traced is None:
                        await response(scope, receive, send)
                        return
                    sent = time.monotonic_ns()
                    await response(scope, receive, send)
                    self.dp.tracer.finish(*traced, sent, time.monotonic_ns())
                    return
            await starlette(scope, receive, send)

        return asgi

    def starlette(self) -> Starlette:
        m = "/v2/models/{model}"
        mv = "/v2/models/{model}/versions/{version:int}"
        r = self.route
        routes = [
            r("/v2/health/live", self.live, ["GET"], "health"),
            r("/v2/health/ready", self.ready, ["GET"], "health"),
            r("/v2", self.server_metadata, ["GET"], "metadata"),
            r("/v2/models/stats", self.model_stats, ["GET"], "statistics"),
            r("/v2/logging", self.logging, ["GET", "POST"], "logging"),
            r("/v2/trace/setting", self.trace, ["GET", "POST"], "trace"),
            r("/v2/repository/index", self.index, ["POST"], "model-repository"),
            r("/v2/repository/models/{model}/load", self.load, ["POST"], "model-repository"),
            r("/v2/repository/models/{model}/unload", self.unload, ["POST"], "model-repository"),
            r("/v2/repository/{repo}/models/{model}/load", self.load, ["POST"], "model-repository"),
            r("/v2/repository/{repo}/models/{model}/unload", self.unload, ["POST"], "model-repository"),
            r("/v2/systemsharedmemory/status", self.shm_status, ["GET"], "shared-memory"),
            r("/v2/systemsharedmemory/region/{region}/status", self.shm_status, ["GET"], "shared-memory"),
            r("/v2/systemsharedmemory/region/{region}/register", self.shm_register, ["POST"], "shared-memory"),
            r("/v2/systemsharedmemory/unregister", self.shm_unregister, ["POST"], "shared-memory"),
            r("/v2/systemsharedmemory/region/{region}/unregister", self.shm_unregister, ["POST"], "shared-memory"),
            r("/v2/cudasharedmemory/status", self.cuda_status, ["GET"], "shared-memory"),
            r("/v2/cudasharedmemory/region/{region}/status", self.cuda_status, ["GET"], "shared-memory"),
            r("/v2/cudasharedmemory/region/{region}/register", self.cuda_register, ["POST"], "shared-memory"),
            r("/v2/cudasharedmemory/unregister", self.cuda_unregister, ["POST"], "shared-memory"),
            r("/v2/cudasharedmemory/region/{region}/unregister", self.cuda_unregister, ["POST"], "shared-memory"),
        ]
        for base in (m, mv):
            routes += [
                r(base, self.model_metadata, ["GET"], "metadata"),
                r(base + "/ready", self.model_ready, ["GET"], "health"),
                r(base + "/config", self.model_config, ["GET"], "model-config"),
                r(base + "/stats", self.model_stats, ["GET"], "statistics"),
                r(base + "/infer", self.infer, ["POST"], "inference"),
                r(base + "/generate", self.generate, ["POST"], "inference"),
                r(base + "/generate_stream", self.generate_stream, ["POST"], "inference"),
            ]
        routes.append(r(m + "/trace/setting", self.trace, ["GET", "POST"], "trace"))

        async def http_error(request: Request, exc: HTTPException) -> Response:
            if exc.status_code == 405:
                return json_response({"error": "Method Not Allowed"}, 405)
            return json_response({"error": "Not Found"}, exc.status_code)

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


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
