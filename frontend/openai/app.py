"""The OpenAI-compatible API over the models in the repository, answered as Triton's OpenAI
frontend answers it: GET /v1/models[/{model}], POST /v1/completions, POST /v1/chat/completions,
POST /v1/embeddings, POST /v1/models/{model}/load and /unload (explicit model control mode),
with GET /metrics and GET /health/ready beside them.

A model that takes `text_input` and answers `text_output` (mapping.py) serves completions;
chat needs a chat template (`--tokenizer`). Bodies are checked against the OpenAI schema (422
with the field's error), then against what the server and the model can do (400 naming what is
not supported); a client that goes away cancels its request in the model.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError
from tritond.wire.options import OpenAIConfig

from ..client_subject import SubjectRule
from ..dataplane import Dataplane
from ..errors import http_status
from ..http.disconnect import until_disconnect
from ..metrics import CONTENT_TYPE, MetricsEndpoint
from . import requests
from .errors import ApiError, client_error, server_error
from .generation import Tally, model_pieces, pieces
from .mapping import embedding_inputs, interface, limit_max_tokens
from .responses import Reply, model_object
from .schemas import CHAT, COMPLETION, EMBEDDING
from .tokenizer import CannotRender, TemplateRejected, Tokenizer
from .validation import ValidationFailed, error, validate

log = logging.getLogger("tritond.openai")

SSE_MEDIA_TYPE = "text/event-stream"


def json_response(doc, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _detail(message: str, status: int) -> Response:
    return json_response({"detail": message}, status)


def _request_error(message: str, status: int, code: str, kind: str = "invalid_request_error") -> Response:
    return json_response({"error": {"message": message, "type": kind, "code": code}}, status)


# The HTTP API categories whose restrictions an OpenAI API inherits: the port serves the same
# models, so what HTTP keeps from a client it keeps too.
HTTP_CATEGORIES = {"inference": ("inference",), "model-repository": ("model-repository", "metadata"),
                   "health": ("health",), "metrics": ()}


@dataclass
class HttpRestrictions:
    """HTTP's restricted APIs (--http-restricted-api, --http-restricted-api-subject), applied
    to the OpenAI routes of the categories in HTTP_CATEGORIES."""
    headers: dict[str, tuple[str, str]] = field(default_factory=dict)    # category -> (header, value)
    subjects: dict[str, SubjectRule] = field(default_factory=dict)       # category -> certificate subjects
    client_certificate: Callable[[dict], bytes | None] | None = None     # DER certificate of the client

    def refusal(self, api: str, request: Request) -> str | None:
        """Why `request` may not call `api` (None: it may)."""
        for category in HTTP_CATEGORIES[api]:
            header = self.headers.get(category)
            if header is not None and request.headers.get(header[0]) != header[1]:
                return f"This API is restricted, expecting header '{header[0]}'"
            rule = self.subjects.get(category)
            if rule is not None and not rule.admits(
                    self.client_certificate(request.scope) if self.client_certificate else None):
                return "This API is restricted to clients with an authorized certificate subject"
        return None


class OpenAIApi:
    def __init__(self, dataplane: Dataplane, cfg: OpenAIConfig, tokenizer: Tokenizer | None,
                 max_input_size: int, metrics: MetricsEndpoint | None = None, strict_readiness: bool = True,
                 explicit: bool = False, http: HttpRestrictions | None = None) -> None:
        self.dp = dataplane
        self.http = http or HttpRestrictions()
        self.client = dataplane.client
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.max_input_size = max_input_size
        self.metrics_endpoint = metrics
        self.strict_readiness = strict_readiness
        self.created: dict[str, int] = {}      # model -> when this frontend first saw it ready
        self.explicit = explicit                # --model-control-mode=explicit: load/unload allowed
        self._control = asyncio.Lock()          # one load or unload at a time, as Triton's frontend

    # ------------------------------------------------------------- plumbing

    def guard(self, fn: Callable[[Request], Awaitable[Response]], api: str
              ) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler: the API's restriction (401) and HTTP's (403), errors as Triton's frontend
        answers them, nothing escapes."""
        restriction = self.cfg.restricted.get(api)

        async def endpoint(request: Request) -> Response:
            if restriction is not None and request.headers.get(restriction[0]) != restriction[1]:
                return _request_error(f"This API is restricted, expecting header '{restriction[0]}' with valid "
                                      f"value", 401, "invalid_auth", "authentication_error")
            refusal = self.http.refusal(api, request)
            if refusal is not None:
                return _request_error(refusal, 403, "permission_denied", "permission_error")
            try:
                return await fn(request)
            except _TooLarge as e:
                return _request_error(f"Request size of {e.size} bytes exceeds the maximum allowed input size of "
                                      f"{e.limit} bytes. Use --http-max-input-size to increase the limit.", 413,
                                      "content_too_large")
            except ValidationFailed as e:
                return json_response({"detail": e.errors}, 422)
            except ApiError as e:
                return _detail(e.message, e.status)
            except TritonError as e:
                return _detail(e.message, http_status(e))
            except ClientDisconnect:
                return Response(status_code=400)
            except Exception:
                log.exception("unexpected error handling %s %s", request.method, request.url.path)
                return _detail("internal error while handling the request", 500)
        return endpoint

    async def json_body(self, request: Request) -> object:
        """The parsed body, never more than --http-max-input-size bytes (413 as Triton's
        frontend words it), or 422 when it is not JSON."""
        declared = request.headers.get("content-length")
        limit = self.max_input_size
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise _TooLarge(int(declared), limit)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _TooLarge(len(body), limit)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise ValidationFailed([error("json_invalid", (e.pos,), "JSON decode error", {}, {"error": e.msg})]) \
                from None

    def entry(self, name: str) -> S.ModelEntry:
        """The model a request names: 400 'Unknown model' unless it is loaded (Triton's frontend
        knows the loaded models only; one in the repository but not loaded is unknown too)."""
        if name not in self.client.table.names:
            raise client_error(f"Unknown model: {name}")
        try:
            return self.dp.entry(name)
        except TritonError as e:
            if e.code is Code.NOT_FOUND:
                raise client_error(f"Unknown model: {name}") from None
            raise

    # ------------------------------------------------------------- models

    def ready_models(self) -> list[str]:
        names = sorted({e.name for e in self.client.table.table.models if e.state is S.ModelState.READY}
                       if self.client.table.table is not None else ())
        now = int(time.time())
        for name in names:
            self.created.setdefault(name, now)
        return names

    async def list_models(self, request: Request) -> Response:
        return json_response({"object": "list",
                              "data": [model_object(n, self.created[n]) for n in self.ready_models()]})

    async def retrieve_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self.ready_models():
            return _detail(f"Unknown model: {name}", 404)
        return json_response(model_object(name, self.created[name]))

    async def load_model(self, request: Request) -> Response:
        """POST /v1/models/{model}/load: 400 when the model is already ready; one at a time, so
        of concurrent loads of a model one succeeds and the rest find it loaded."""
        name = request.path_params["model"]
        self._explicit_only()
        async with self._control:
            if name in self.ready_models():
                raise client_error(f"Model '{name}' is already loaded")
            await self._repository(self.dp.load_model(S.LoadModel(name)), "load", name)
            self.created[name] = int(time.time())
        return json_response(model_object(name, self.created[name]))

    async def unload_model(self, request: Request) -> Response:
        """POST /v1/models/{model}/unload: 400 'Unknown model' unless the model is ready."""
        name = request.path_params["model"]
        self._explicit_only()
        async with self._control:
            if name not in self.ready_models():
                raise client_error(f"Unknown model: {name}")
            await self._repository(self.client.control(S.UnloadModel(name)), "unload", name)
            self.created.pop(name, None)
        return json_response({"status": "success", "model": name})

    def _explicit_only(self) -> None:
        if not self.explicit:
            raise client_error("Model load/unload requires --model-control-mode=explicit")

    @staticmethod
    async def _repository(op: Awaitable[object], verb: str, name: str) -> None:
        """A load or unload, its error worded as Triton's frontend words it: 400 for an invalid
        argument, 500 otherwise."""
        try:
            await op
        except TritonError as e:
            status = 400 if e.code is Code.INVALID_ARG else 500
            raise ApiError(status, f"Failed to {verb} model '{name}': {e.message}") from None

    # ------------------------------------------------------------- completions

    async def completions(self, request: Request) -> Response:
        body = await self.json_body(request)
        validate(COMPLETION, body)
        gen = requests.completion(body, self.cfg.default_max_tokens)
        return await self.generate(request, self.entry(gen.model), gen, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        body = await self.json_body(request)
        validate(CHAT, body)
        gen, messages = requests.chat(body, self.cfg.default_max_tokens, self.cfg.tool_call_parser)
        entry = self.entry(gen.model)
        if self.tokenizer is None or self.tokenizer.template is None:
            raise server_error("Unknown tokenizer")
        try:
            # rendering is CPU work of unbounded length: off the event loop every request shares
            gen.prompt = requests.check_prompt(await asyncio.to_thread(self.tokenizer.render, messages, gen.tools))
        except TemplateRejected as e:
            raise client_error(f"the chat template refused the messages: {e}") from None
        except CannotRender as e:
            raise client_error(f"the chat template cannot render these messages: {e}") from None
        except ValueError as e:
            raise server_error(str(e)) from None
        return await self.generate(request, entry, gen, chat=True)

    async def generate(self, request: Request, entry: S.ModelEntry, gen: requests.Generation, chat: bool
                       ) -> Response:
        iface = interface(entry)
        limit_max_tokens(entry, gen)
        reply = Reply(f"cmpl-{uuid.uuid4()}", int(time.time()), gen, chat, self.tokenizer)
        stream = pieces(self.dp, entry, iface, gen, reply.id)
        if not gen.stream:
            tally = await until_disconnect(request.receive, _collect(stream, Tally(gen.n)))
            return json_response(await asyncio.to_thread(reply.body, tally))     # counts tokens
        try:
            first = await until_disconnect(request.receive, anext(stream))
        except BaseException:
            await stream.aclose()
            raise
        return ClosingStreamingResponse(reply.events(first, stream), media_type=SSE_MEDIA_TYPE)

    async def embeddings(self, request: Request) -> Response:
        """POST /v1/embeddings: one input (a string or token ids) through a model with vLLM's
        embedding interface."""
        body = await self.json_body(request)
        validate(EMBEDDING, body)
        entry = self.entry(body["model"])
        tensors = embedding_inputs(entry, body["input"], body.get("dimensions"))
        tally = Tally(1)
        stream = model_pieces(self.dp, entry, bool(entry.view and entry.view.decoupled), tensors, 0,
                              f"embd-{uuid.uuid4()}")
        await until_disconnect(request.receive, _collect(stream, tally))
        try:
            vector = json.loads(tally.texts[0])
            if not isinstance(vector, list) or not all(isinstance(x, (int, float)) for x in vector):
                raise ValueError
        except ValueError:
            raise server_error(f"model '{entry.name}' answered an embedding that is not a JSON list of "
                               f"numbers") from None
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(np.array(vector, np.float32).tobytes()).decode()
        prompt_tokens = tally.prompt_tokens
        if prompt_tokens is None:
            text = body["input"]
            prompt_tokens = (len(text) if isinstance(text, list) else
                             await asyncio.to_thread(self.tokenizer.count, text, True) if self.tokenizer is not None
                             else None)
        usage = None if prompt_tokens is None else {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return json_response({"object": "list", "data": [{"object": "embedding", "embedding": vector, "index": 0}],
                              "model": body["model"], "usage": usage})

    # ------------------------------------------------------------- observability

    async def health_ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.client.ready(self.strict_readiness) else 400)

    async def metrics(self, request: Request) -> Response:
        if self.metrics_endpoint is None:
            return _detail("metrics are off (--allow-metrics=false)", 404)
        if self.metrics_endpoint.task is None:       # the host sampler polls only for a port that is scraped
            self.metrics_endpoint.start()
        try:
            body = await self.metrics_endpoint.render()
        except TritonError as e:
            return Response(e.message, status_code=503, media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE)

    # ------------------------------------------------------------- app

    def app(self) -> Starlette:
        g = self.guard
        routes = [
            Route("/v1/models", g(self.list_models, "model-repository"), methods=["GET"]),
            Route("/v1/models/{model}", g(self.retrieve_model, "model-repository"), methods=["GET"]),
            Route("/v1/models/{model}/load", g(self.load_model, "model-repository"), methods=["POST"]),
            Route("/v1/models/{model}/unload", g(self.unload_model, "model-repository"), methods=["POST"]),
            Route("/v1/completions", g(self.completions, "inference"), methods=["POST"]),
            Route("/v1/chat/completions", g(self.chat_completions, "inference"), methods=["POST"]),
            Route("/v1/embeddings", g(self.embeddings, "inference"), methods=["POST"]),
            Route("/health/ready", g(self.health_ready, "health"), methods=["GET"]),
            Route("/metrics", g(self.metrics, "metrics"), methods=["GET"]),
        ]

        async def http_error(request: Request, exc: HTTPException) -> Response:
            return _detail("Method Not Allowed" if exc.status_code == 405 else "Not Found", exc.status_code)

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose events are closed when the response ends however it ends: a client that
    goes away cancels the response, maybe inside send(), which leaves the events suspended (and
    the model request running) until garbage collection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.shield(self.body_iterator.aclose())


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size)
        self.size = size
        self.limit = limit


async def _collect(stream, tally: Tally) -> Tally:
    async for piece in stream:
        tally.add(piece)
    return tally
