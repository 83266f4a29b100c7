"""`inference.GRPCInferenceService`: every RPC, answered through the shared dataplane and broker.

Errors leave as gRPC status codes (frontend/errors.py); inside ModelStreamInfer a failed
request becomes an `error_message` response and the stream stays open.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tritond import logs
from tritond.repository.render import config_from_json
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid, unavailable

from ..client_subject import SubjectRule
from ..dataplane import Dataplane, RequestOptions
from ..errors import GRPC_CODE_NAME
from ..header_forward import HeaderForward
from ..metadata import SERVER_VERSION, model_metadata
from ..test_hooks import grpc_response_delay_s
from ..tracing import Pending
from . import converters as cv
from .codec import ResponseEncoder, parse_request
from .parsing import UNPARSABLE, UNPARSED

log = logging.getLogger("tritond.grpc")

SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
DECOUPLED_INFER = "ModelInfer RPC doesn't support models with decoupled transaction policy"
STREAM_OUTSTANDING = 64     # requests of one ModelStreamInfer stream in flight at once

Send = Callable[[bytes], Awaitable[None]]


class _Turns:
    """One stream's in-turn writes: each request answered in turn takes the next number, and its
    message is written once every number before it is written or settled without one; a message
    that is early waits here (no task waits for it)."""

    __slots__ = ("write", "issued", "next", "held")

    def __init__(self, write: Send) -> None:
        self.write = write
        self.issued = 0
        self.next = 0
        self.held: dict[int, bytes | None] = {}

    def take(self) -> int:
        n = self.issued
        self.issued += 1
        return n

    async def put(self, n: int, message: bytes | None) -> None:
        """Request `n`'s message (None: it settled without one)."""
        if n != self.next:
            self.held[n] = message
            return
        self.next += 1
        if message is not None:
            await self.write(message)
        while self.next in self.held:
            message = self.held.pop(self.next)
            self.next += 1
            if message is not None:
                await self.write(message)


class _InTurn:
    """The writer of a stream request answered in turn (`_Turns`); its window slot is given back
    when its response is ready, so responses waiting for their turn do not keep the stream from
    being read."""

    __slots__ = ("turns", "n", "release", "sent")

    def __init__(self, turns: _Turns, release: Callable[[], None]) -> None:
        self.turns, self.n, self.release = turns, turns.take(), release
        self.sent = False

    def give_back(self) -> None:
        if self.release is not None:
            self.release, release = None, self.release
            release()

    async def finish(self) -> None:
        self.give_back()
        if not self.sent:
            self.sent = True
            await self.turns.put(self.n, None)

    async def __call__(self, message: bytes) -> None:
        self.give_back()
        self.sent = True
        await self.turns.put(self.n, message)


RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-"
BROKER_LATE = "the server's broker did not answer in time"
INTERNAL = "internal error while handling the request"
MAX_CACHED_ENTRIES = 4096   # (model, version string) pairs resolved per model table
STATUS = {name: grpc.StatusCode[code] for name, code in GRPC_CODE_NAME.items()}


@dataclass
class GrpcOptions:
    server_name: str = "triton"
    strict_readiness: bool = True
    extensions: list[str] = field(default_factory=list)
    restricted: dict[str, tuple[str, str]] = field(default_factory=dict)   # category -> (key, value)
    subjects: dict[str, SubjectRule] = field(default_factory=dict)   # category -> certificate subjects
    init_failed: bool = False       # started although a repository failed (--exit-on-error=false)
    paged: bool = False             # --model-control-mode=paged: a paged-out model has metadata too
    header_forward: str | None = None   # pattern of the metadata keys forwarded to models


def status_of(e: TritonError) -> grpc.StatusCode:
    return STATUS.get(e.code, grpc.StatusCode.INTERNAL)


def traceparent(context: grpc.aio.ServicerContext) -> str:
    """The client's W3C trace context, when it sent one."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return value
    return ""


def rpc(category: str) -> Callable:
    """Admission (shutdown, restricted protocol) and error mapping around a unary RPC."""
    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def handler(self: "InferenceServicer", request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self.admit(context, category)
            if request is UNPARSED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, UNPARSABLE)
            if self.response_delay_s:
                await asyncio.sleep(self.response_delay_s)
            try:
                return await fn(self, request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as e:
                await abort_with(context, e, fn.__name__)
        return handler
    return wrap


async def abort_with(context: grpc.aio.ServicerContext, e: Exception, where: str) -> None:
    """End the call with the status an exception stands for; a bug is logged here and never
    echoed to the client. Call it from the `except` block (the log takes its traceback)."""
    if isinstance(e, TritonError):
        log.debug("%s failed: %s", where, e.message)
        await context.abort(status_of(e), e.message)
    if isinstance(e, asyncio.TimeoutError):
        await context.abort(grpc.StatusCode.UNAVAILABLE, BROKER_LATE)
    log.exception("unexpected error in %s", where)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: Dataplane, opts: GrpcOptions) -> None:
        self.dp = dataplane
        self.client = dataplane.client
        self.opts = opts
        self.restricted = {cat: (RESTRICTED_HEADER_PREFIX + key, value)
                           for cat, (key, value) in opts.restricted.items()}
        # ModelInfer skips admission while nothing can refuse it
        self.gated_inference = "inference" in self.restricted or "inference" in opts.subjects
        self.stopping = False
        self.inflight = 0
        self.encoder = ResponseEncoder()
        self.response_delay_s = grpc_response_delay_s()             # a Triton test hook (0: off)
        self._table: Any = None                                     # the table _entries were resolved in
        self._entries: dict[tuple[str, str], S.ModelEntry] = {}     # (name, version string) -> entry
        self.forward = HeaderForward(opts.header_forward) if opts.header_forward is not None else None

    # ------------------------------------------------------------- admission and shutdown

    async def admit(self, context: grpc.aio.ServicerContext, category: str) -> None:
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        restriction = self.restricted.get(category)
        if restriction is not None:
            if restriction not in tuple(context.invocation_metadata() or ()):
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"This protocol is restricted, expecting header '{restriction[0]}'")
        rule = self.opts.subjects.get(category)
        if rule is not None and not rule.admits((context.auth_context().get("x509_pem_cert") or [None])[0]):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "This protocol is restricted to clients with an authorized certificate subject")

    async def drain(self, timeout: float) -> None:
        """Refuse new RPCs and wait (bounded) for in-flight inferences to finish."""
        self.stopping = True
        deadline = time.monotonic() + timeout
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def ready(self) -> bool:
        return not self.opts.init_failed and self.client.ready(self.opts.strict_readiness, self.opts.paged)

    # ------------------------------------------------------------- health and metadata

    @rpc("health")
    async def ServerLive(self, request, context):
        # the server serves once every frontend process accepts (readiness tracks the broker),
        # unless initialization failed
        return pb.ServerLiveResponse(live=not self.opts.init_failed and self.client.serving)

    @rpc("health")
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.ready())

    @rpc("health")
    async def ModelReady(self, request, context):
        """Unknown models and versions are simply not ready (status OK), as in Triton's core."""
        version = cv.parse_version(request.version)
        try:
            entry = self.client.table.resolve(request.name, version)
        except TritonError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=await self.client.model_ready(entry))

    @rpc("metadata")
    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=self.opts.server_name, version=SERVER_VERSION,
                                         extensions=self.opts.extensions)

    @rpc("metadata")
    async def ModelMetadata(self, request, context):
        version = cv.parse_version(request.version)
        table = self.client.table
        entry = table.resolve(request.name, version, restarting_ok=self.opts.paged)
        versions = [str(version)] if version >= 0 else sorted(
            (str(v) for v, e in table.by_name[request.name].items()
             if e.state is S.ModelState.READY or (self.opts.paged and e.restarting)), key=int)
        return cv.model_metadata(model_metadata(entry.config or {}, request.name, versions))

    @rpc("model-config")
    async def ModelConfig(self, request, context):
        entry = self.client.table.any_entry(request.name, cv.parse_version(request.version))
        return pb.ModelConfigResponse(config=config_from_json(entry.config or {}))

    @rpc("statistics")
    async def ModelStatistics(self, request, context):
        stats = await self.client.control(S.Statistics(request.name, cv.parse_version(request.version)))
        return cv.model_statistics(stats)

    # ------------------------------------------------------------- inference

    def _entry(self, name: str, version: str) -> S.ModelEntry:
        """The model version a request's (name, version string) goes to, resolved once per
        model table (the broker publishes a new one on every change); errors are not kept."""
        table = self.client.table
        if table is not self._table:
            self._table = table
            self._entries = {}
        key = (name, version)
        entry = self._entries.get(key)
        if entry is None:
            entry = self.dp.entry(name, cv.parse_version(version))
            if len(self._entries) >= MAX_CACHED_ENTRIES:
                self._entries.clear()
            self._entries[key] = entry
        return entry

    async def _infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext | None = None,
                     raw: list[memoryview] | None = None) -> bytes:
        client = self.client
        mode = client.trace_mode(request.model_name) if client.tracing else ""
        pending = Pending("GRPC", mode, traceparent(context) if context else "") if mode else None
        entry = self._entry(request.model_name, request.model_version)
        if entry.view is not None and entry.view.decoupled:
            raise TritonError(Code.UNSUPPORTED, DECOUPLED_INFER)
        params = request.parameters
        opts = cv.request_options(params) if params else RequestOptions()
        request_id = request.id
        if self.forward is not None and context is not None:
            opts.params.update(self.forward.parameters(context.invocation_metadata() or ()))
        if request_id:
            opts.id = request_id
            logs.REQUEST_ID.set(request_id)      # this RPC's task: its log lines carry the id
        if pending is not None:
            opts.trace = pending.start()
            opts.on_cancelled = functools.partial(self.dp.tracer.cancelled, pending, entry.name, request_id)
        inputs = cv.parse_inputs(request, raw)
        outputs = cv.parse_outputs(request) if request.outputs else []
        result = await self.dp.infer(entry, inputs, outputs, opts)
        info = result.reply.trace if result.reply is not None else None
        try:
            return self.encoder.infer_response(result)
        finally:
            self.dp.release(result)
            if info is not None:
                # grpc.aio writes the response after the handler returns: both send times are taken here
                now = time.monotonic_ns()
                self.dp.tracer.finish(info, pending, entry.name, result.model_version, request_id, now, now)

    async def ModelInfer(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Bytes in, bytes out (parsing.py registers it without (de)serializers): the request
        is parsed once here and the response encoded once (codec.py). Admission and errors as
        `rpc` handles them for the other RPCs."""
        if self.stopping or self.gated_inference:
            await self.admit(context, "inference")
        try:
            request, raw = parse_request(data)
        except Exception:   # DecodeError, and whatever else protobuf raises on hostile bytes
            request = raw = None
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, UNPARSABLE)
        self.inflight += 1
        try:
            return await self._infer(request, context, raw)
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await abort_with(context, e, "ModelInfer")
        finally:
            self.inflight -= 1

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> None:
        """Requests reach the broker in arrival order. As in Triton, the response to a request
        for a model that is not decoupled is written once those of the stream's earlier such
        requests are; a decoupled model's responses (0..N, each with `triton_final_response`) are
        written as they come. At most STREAM_OUTSTANDING requests of a stream are in flight:
        beyond that the stream is not read. With metadata `triton_grpc_error: true` the first
        error ends the stream."""
        await self.admit(context, "inference")
        abort_on_error = any(k == "triton_grpc_error" and v.lower() == "true"
                             for k, v in context.invocation_metadata() or ())
        forwarded: dict[str, str] | TritonError | None = None     # the stream's metadata, for every request
        if self.forward is not None:
            try:
                forwarded = self.forward.parameters(context.invocation_metadata() or ())
            except TritonError as e:
                forwarded = e
        parent = traceparent(context)
        lock = asyncio.Lock()
        slots = asyncio.Semaphore(STREAM_OUTSTANDING)
        tasks: set[asyncio.Task] = set()
        fatal: list[TritonError] = []
        ended = asyncio.Event()

        async def write(message: bytes) -> None:
            async with lock:
                if not fatal:
                    await context.write(message)

        async def failed(request: pb.ModelInferRequest, e: TritonError, send: Send) -> None:
            if abort_on_error:
                fatal.append(e)
                ended.set()
                return
            await send(cv.stream_error(request, e).SerializeToString())

        async def settle(send: Send) -> None:
            """A request answered: its window slot back, the next in-turn response free to go."""
            if isinstance(send, _InTurn):
                await send.finish()
            else:
                slots.release()

        async def answer(request: pb.ModelInferRequest, entry: S.ModelEntry | TritonError, send: Send) -> None:
            self.inflight += 1
            try:
                if isinstance(entry, TritonError):
                    raise entry
                await self._stream_answer(request, entry, send, forwarded, parent, abort_on_error)
            except TritonError as e:
                await failed(request, e, send)
            except Exception:  # a bug must not take the stream down
                log.exception("stream request failed")
                await failed(request, TritonError(Code.INTERNAL, "internal error while handling the request"), send)
            finally:
                self.inflight -= 1
                await settle(send)

        async def read() -> None:
            turns = _Turns(write)
            try:
                async for request in request_iterator:
                    if fatal:
                        break
                    error = (unavailable(SHUTTING_DOWN) if self.stopping
                             else invalid(UNPARSABLE) if request is UNPARSED else None)
                    await slots.acquire()
                    send: Send = write
                    entry = self._resolve(request) if error is None else error
                    if isinstance(entry, TritonError) or entry.view is None or not entry.view.decoupled:
                        send = _InTurn(turns, slots.release)
                    if error is not None:
                        try:
                            await failed(request, error, send)
                        finally:
                            await settle(send)
                        continue
                    task = asyncio.create_task(answer(request, entry, send))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                ended.set()

        reader = asyncio.create_task(read())
        try:
            await ended.wait()
            if fatal:
                await context.abort(status_of(fatal[0]), fatal[0].message)
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    def _resolve(self, request: pb.ModelInferRequest) -> S.ModelEntry | TritonError:
        """The model version a stream request goes to, or why there is none (its answer)."""
        try:
            return self._entry(request.model_name, request.model_version)
        except TritonError as e:
            return e

    async def _stream_answer(self, request: pb.ModelInferRequest, entry: S.ModelEntry, write: Send,
                             forwarded: dict[str, str] | TritonError | None = None, parent: str = "",
                             abort_on_error: bool = False) -> None:
        """Answer one request of a stream: every response of a decoupled model as it comes,
        the bare final flag only when asked for (`triton_enable_empty_final_response`); with
        `abort_on_error` an error response is raised, to end the stream with its status. A
        request to a model that is not decoupled is traced as a unary one (`parent`: the
        stream's W3C trace context)."""
        client = self.client
        mode = client.trace_mode(request.model_name) if client.tracing else ""
        opts = cv.request_options(request.parameters)
        if forwarded is not None:
            if isinstance(forwarded, TritonError):
                raise forwarded
            opts.params.update(forwarded)
        opts.id = request.id
        inputs, outputs = cv.parse_inputs(request), cv.parse_outputs(request)
        if entry.view is None or not entry.view.decoupled:
            pending = Pending("GRPC", mode, parent) if mode else None
            if pending is not None:
                opts.trace = pending.start()
                opts.on_cancelled = functools.partial(self.dp.tracer.cancelled, pending, entry.name, request.id)
            result = await self.dp.infer(entry, inputs, outputs, opts)
            info = result.reply.trace if result.reply is not None else None
            try:
                message = self.encoder.stream_response(result, True)
            finally:
                self.dp.release(result)
            sent = time.monotonic_ns() if info is not None else 0
            await write(message)
            if info is not None:
                self.dp.tracer.finish(info, pending, entry.name, result.model_version, request.id, sent,
                                      time.monotonic_ns())
            return
        # One write in flight while the next response is made ready: a write waits for gRPC
        # to take the message, which would otherwise add to every response's latency.
        pending: asyncio.Future | None = None
        try:
            async with contextlib.aclosing(self.dp.infer_stream(entry, inputs, outputs, opts)) as responses:
                async for item in responses:
                    if item.error is not None:
                        if abort_on_error:      # what came before the error is written first
                            if pending is not None:
                                await pending
                            raise item.error
                        message = cv.stream_error(request, item.error, item.final).SerializeToString()
                    elif item.result is not None:
                        message = self.encoder.stream_response(item.result, item.final)
                    elif opts.empty_final:
                        message = cv.stream_empty_final(request).SerializeToString()
                    else:
                        continue
                    if pending is not None:
                        await pending
                    pending = asyncio.ensure_future(write(message))
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    # ------------------------------------------------------------- repository

    @rpc("model-repository")
    async def RepositoryIndex(self, request, context):
        if request.repository_name:
            raise TritonError(Code.UNSUPPORTED, "'repository_name' specification is not supported")
        return cv.repository_index(await self.client.control(S.RepositoryIndex(request.ready)))

    @rpc("model-repository")
    async def RepositoryModelLoad(self, request, context):
        if request.repository_name:
            raise TritonError(Code.UNSUPPORTED, "'repository_name' specification is not supported")
        await self.dp.load_model(*cv.load_model(request))
        return pb.RepositoryModelLoadResponse()

    @rpc("model-repository")
    async def RepositoryModelUnload(self, request, context):
        if request.repository_name:
            raise TritonError(Code.UNSUPPORTED, "'repository_name' specification is not supported")
        await self.client.control(S.UnloadModel(request.model_name, cv.unload_dependents(request)))
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------- shared memory

    @rpc("shared-memory")
    async def SystemSharedMemoryStatus(self, request, context):
        return cv.shm_status(await self.client.control(S.ShmStatus(request.name)))

    @rpc("shared-memory")
    async def SystemSharedMemoryRegister(self, request, context):
        await self.client.control(S.ShmRegister(request.name, request.key, request.offset, request.byte_size))
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc("shared-memory")
    async def SystemSharedMemoryUnregister(self, request, context):
        await self.client.control(S.ShmUnregister(request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc("shared-memory")
    async def CudaSharedMemoryStatus(self, request, context):
        return cv.cuda_status(await self.client.control(S.CudaStatus(request.name)))

    @rpc("shared-memory")
    async def CudaSharedMemoryRegister(self, request, context):
        await self.client.control(S.CudaRegister(request.name, request.raw_handle, request.device_id,
                                                 request.byte_size))
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc("shared-memory")
    async def CudaSharedMemoryUnregister(self, request, context):
        await self.client.control(S.CudaUnregister(request.name))
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------- settings

    @rpc("trace")
    async def TraceSetting(self, request, context):
        settings = await self.client.control(S.TraceSettings(request.model_name, cv.trace_updates(request)))
        return cv.trace_settings(settings)

    @rpc("logging")
    async def LogSettings(self, request, context):
        settings = await self.client.control(S.LogSettings(cv.log_updates(request)))
        return cv.log_settings(settings)
