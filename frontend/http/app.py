"""The KServe v2 / Triton HTTP API: Starlette serves every route but inference, whose hot path
is the raw ASGI InferRoute (infer.py)."""
from __future__ import annotations

import base64
import logging
import re
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

from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid

from ..client_subject import SubjectRule
from ..dataplane import Dataplane
from ..header_forward import HeaderForward
from ..metadata import SERVER_VERSION, model_metadata
from .body import read_body
from .codec import parse_json
from .generate import generate, generate_stream, parse_generate
from .infer import InferRoute, error_response, json_response

_BAD_READY = "Invalid value for 'ready': expected a boolean"
# A repository index body whose 'ready' is an array or object (checked before parsing, so a
# deeply nested one is answered as Triton does rather than as a JSON nesting error).
_NESTED_READY = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


log = logging.getLogger("tritond.http")
# libevhtp's method numbers, which tritonserver's verbose request lines print
EVHTP_METHODS = {"GET": 0, "HEAD": 1, "POST": 2, "PUT": 3, "DELETE": 4, "OPTIONS": 8, "TRACE": 13, "CONNECT": 14,
                 "PATCH": 15}


@dataclass
class HttpOptions:
    server_name: str = "triton"
    strict_readiness: bool = True
    extensions: list[str] = field(default_factory=list)
    max_input_size: int = 1 << 26
    restricted: dict[str, tuple[str, str]] = field(default_factory=dict)   # category -> (header, value)
    subjects: dict[str, SubjectRule] = field(default_factory=dict)   # category -> certificate subjects
    client_certificate: Callable[[Scope], bytes | None] | None = None   # DER certificate of the client
    header_forward: str | None = None   # pattern of the headers forwarded to models
    init_failed: bool = False       # started although a repository failed (--exit-on-error=false)
    paged: bool = False             # --model-control-mode=paged: a paged-out model has metadata too


class HttpApi:
    def __init__(self, dataplane: Dataplane, opts: HttpOptions) -> None:
        self.dp = dataplane
        self.client = dataplane.client
        self.opts = opts
        self.infer_route = InferRoute(dataplane, opts.max_input_size, opts.restricted.get("inference"),
                                      opts.subjects.get("inference"), opts.client_certificate,
                                      HeaderForward(opts.header_forward) if opts.header_forward is not None else None)

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

    async def body(self, request: Request) -> bytes | bytearray:
        """The request body, decompressed, never more than --http-max-input-size bytes."""
        headers = request.headers
        return await read_body(request.receive, headers.get("content-encoding", "").strip().lower(),
                               headers.get("content-length"), self.opts.max_input_size)

    @staticmethod
    def version(request: Request) -> int:
        v = request.path_params.get("version")
        return int(v) if v is not None else -1

    # ------------------------------------------------------------- health and metadata

    async def live(self, request: Request) -> Response:
        """Live means the server serves: a broker restarting makes the server not ready,
        not dead (an orchestrator would otherwise restart a server that is recovering). Not live
        before every frontend process accepts connections (Triton opens gRPC before HTTP), so a
        client that waited for HTTP finds gRPC open. A server whose initialization failed is
        never live, as Triton's."""
        return Response(status_code=400 if self.opts.init_failed or not self.client.serving else 200)

    async def ready(self, request: Request) -> Response:
        ok = not self.opts.init_failed and self.client.ready(self.opts.strict_readiness, self.opts.paged)
        return Response(status_code=200 if ok else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": self.opts.server_name, "version": SERVER_VERSION,
                              "extensions": self.opts.extensions})

    async def model_metadata(self, request: Request) -> Response:
        name = request.path_params["model"]
        version = self.version(request)
        entry = self.client.table.resolve(name, version, restarting_ok=self.opts.paged)
        versions = [str(version)] if version >= 0 else sorted(
            (str(v) for v, e in self.client.table.by_name[name].items()
             if e.state is S.ModelState.READY or (self.opts.paged and e.restarting)), key=int)
        return json_response(model_metadata(entry.config or {}, name, versions))

    async def model_ready(self, request: Request) -> Response:
        try:
            entry = self.client.table.resolve(request.path_params["model"], self.version(request))
        except TritonError as e:
            if e.code is Code.INVALID_ARG:
                raise
            entry = None
        if entry is None or not await self.client.model_ready(entry):
            return json_response({"error": "Model version not ready"}, 400)
        return Response(status_code=200)

    async def model_config(self, request: Request) -> Response:
        entry = self.client.table.any_entry(request.path_params["model"], self.version(request))
        return json_response(entry.config or {})

    async def model_stats(self, request: Request) -> Response:
        name = request.path_params.get("model", "")
        reply = await self.client.control(S.Statistics(name, self.version(request)))
        stats = msgspec.to_builtins(reply.model_stats)
        if reply.paging:        # paged mode: each pageable model's paging (the proto has no field for it)
            for entry in stats:
                if entry["name"] in reply.paging:
                    entry["paging"] = msgspec.to_builtins(reply.paging[entry["name"]])
        return json_response({"model_stats": stats})

    # ------------------------------------------------------------- inference

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
        return json_response(reply.settings)

    # ------------------------------------------------------------- app

    def app(self) -> ASGIApp:
        """Starlette serves every route but inference, the hot path: a POST to an infer path
        goes to the raw InferRoute, past Starlette's router and middleware stack."""
        starlette = self.starlette()
        infer = self.infer_route

        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            if log.isEnabledFor(logging.DEBUG) and scope["type"] == "http":     # --log-verbose >= 1
                log.debug("HTTP request: %s %s", EVHTP_METHODS.get(scope["method"], scope["method"]), scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST":
                target = infer.target(scope["path"])
                if target is not None:
                    await infer.serve(scope, receive, send, target)
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
                Route(base + "/infer", self.infer_route, methods=["POST"]),     # other methods: 405
                r(base + "/generate", self.generate, ["POST"], "inference"),
                r(base + "/generate_stream", self.generate_stream, ["POST"], "inference"),
            ]
        routes.append(r(m + "/trace/setting", self.trace, ["GET", "POST"], "trace"))

        async def http_error(request: Request, exc: HTTPException) -> Response:
            if exc.status_code == 405:
                return json_response({"error": "Method Not Allowed"}, 405)
            return json_response({"error": "Not Found"}, exc.status_code)

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

