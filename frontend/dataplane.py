"""The protocol-neutral inference path shared by the HTTP and gRPC frontends.

Validates a request against the model config the broker published (with Triton's error
texts), places tensor bytes (inline when small, else one copy into this frontend's shm
arena, none when the transport already wrote them there), asks the broker, and hands back output views that point into the worker's shm.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritond.repository.datatypes import ELEMENT_SIZE, WIRE_TYPES, bytes_to_array, element_count
from tritond.repository.layout import validate_model_name
from tritond.repository.overrides import write_overrides
from tritond.repository.remote import RemoteError, mirror_model
from tritond.shm.arena import Arena, Block
from tritond.shm.mapping import SegmentMaps
from tritond.wire import schema as S
from tritond.wire.cache_key import inputs_digest
from tritond.wire.errors import TritonError, internal, invalid, request_prefix as prefix, unsupported

from .broker_client import BrokerClient
from .brokers import Brokers
from .classification import classify, output_labels
from .tracing import FrontendTracer

RESERVED_PREFIX = "triton_"
MAX_CACHED_VIEWS = 1024     # model views whose required inputs are remembered
_NO_VIEW = S.ModelView()


def dims_str(dims) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | None = None   # wire-format payload
    region: str = ""                          # client shm region
    offset: int = 0
    nbytes: int = 0
    at: S.Block | None = None                 # where `data` already lies in this frontend's arena


@dataclass
class OutputRequest:
    name: str
    binary: bool | None = None
    classification: int = 0
    region: str = ""
    offset: int = 0
    nbytes: int = 0


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview | None       # None when written to a client region
    region: str = ""
    binary: bool | None = None

    def as_numpy(self) -> np.ndarray:
        return bytes_to_array(self.data, self.datatype, self.shape)


@dataclass
class InferResult:
    model_name: str
    model_version: int
    id: str
    outputs: list[OutputTensor]
    reply: S.InferReply | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Streamed:
    """One reply of a streamed request: a response, an error, or neither (only the end)."""
    result: InferResult | None
    error: TritonError | None
    final: bool


@dataclass
class RequestOptions:
    id: str = ""
    params: dict[str, S.Param] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    trace: S.TraceStart | None = None
    empty_final: bool = False        # gRPC stream: send the bare final flag of a decoupled request
    # A traced request whose client goes away: called with the broker's late reply (its trace)
    on_cancelled: Callable[[S.InferReply], None] | None = None


FLAG_START = 1
FLAG_END = 2
# Streamed replies a frontend lets the model send ahead of what it has written to the client.
STREAM_WINDOW = 64
MAX_STRING_CORRID = 128


def split_parameters(params: dict[str, Any]) -> RequestOptions:
    """Separate Triton's request parameters from those passed through to the model."""
    opts = RequestOptions()
    for key, value in params.items():
        if key.startswith(RESERVED_PREFIX) and key != "triton_enable_empty_final_response":
            raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage "
                          "and should not be specified.")
        if key == "priority":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid("invalid value type for 'priority' parameter, expected uint64_param.")
            opts.priority = value
        elif key == "timeout":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid("invalid value type for 'timeout' parameter, expected int64_param.")
            opts.timeout_us = value
        elif key == "sequence_id":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise invalid("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
            if isinstance(value, str) and len(value) > MAX_STRING_CORRID:
                raise unsupported("string correlation ID cannot be longer than 128 characters")
            opts.correlation_id = value
        elif key in ("sequence_start", "sequence_end"):
            if not isinstance(value, bool):
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
            if value:
                opts.flags |= FLAG_START if key == "sequence_start" else FLAG_END
        elif key == "triton_enable_empty_final_response":
            opts.empty_final = value is True
        elif key == "binary_data_output":
            continue
        else:
            opts.params[key] = value
    return opts


def cache_key(inputs: list[InputTensor]) -> bytes:
    """The response cache's digest of a request's inputs, computed here, where the bytes
    already are, so the broker does not read them."""
    return inputs_digest((t.name, t.datatype, t.shape, t.data) for t in inputs)


def count_bytes_elements(buf: bytes | memoryview, name: str, model: str, request_id: str,
                         expected: int | None = None) -> int:
    """Walk a BYTES payload's length prefixes; raises Triton's errors on truncation or a wrong count."""
    pre = prefix(request_id)
    mv = memoryview(buf)
    pos, n, end = 0, 0, len(mv)
    while pos < end:
        if pos + 4 > end:
            raise invalid(f"{pre}incomplete string length indicator for inference input '{name}' for model "
                          f"'{model}', expecting 4 bytes but only {end - pos} bytes available. Please make sure "
                          f"the string length indicator is in one buffer.")
        length = int.from_bytes(mv[pos:pos + 4], "little")
        pos += 4
        n += 1
        if expected is not None and n > expected:
            raise invalid(f"{pre}unexpected number of string elements {n} for inference input '{name}' for "
                          f"model '{model}', expecting {expected}")
        if pos + length > end:
            raise invalid(f"{pre}incomplete string for inference input '{name}' for model '{model}', expecting "
                          f"string of length {length} but only {end - pos} bytes available.")
        pos += length
    if expected is not None and n != expected:
        raise invalid(f"{pre}expected {expected} string elements for inference input '{name}' for model "
                      f"'{model}', got {n}")
    return n


class Dataplane:
    def __init__(self, client: BrokerClient | Brokers, arena: Arena, maps: SegmentMaps,
                 remote_repositories: list[str] | None = None, tracer: FrontendTracer | None = None,
                 overrides: tuple[str, int] | None = None) -> None:
        self.client = client
        self.arena = arena
        self.maps = maps
        self.remote_repositories = remote_repositories or []
        self.tracer = tracer or FrontendTracer(client)
        self.overrides = overrides      # (run directory, size limit) where file overrides may be written
        self._required_inputs: dict[int, tuple[S.ModelView, list[str]]] = {}   # id(view) -> (view, names)

    async def load_model(self, op: S.LoadModel, files: dict[str, bytes] | None = None) -> None:
        """Ask the broker to load a model. A model of a remote repository is mirrored here
        first, in a thread: the broker mirrors it again before loading and then finds every
        file current, so its loop is not held up (and silent) for the download. `file:`
        overrides are checked and written to a private directory here, off the broker's loop
        and off the wire (the broker takes over the directory); outside explicit mode the
        broker refuses the load without anything written."""
        if files and self.overrides is not None:
            if op.config is None:
                raise invalid("Load parameter 'config' must be specified for model file override")
            bad = validate_model_name(op.name)
            if bad:
                raise invalid(bad)
            run_dir, limit = self.overrides
            op.override_dir = await asyncio.to_thread(write_overrides, run_dir, op.name, files, limit)
        if validate_model_name(op.name) is None:
            for repo in self.remote_repositories:
                try:
                    await asyncio.to_thread(mirror_model, repo, op.name)
                except RemoteError:
                    pass       # not in this repository, or unreachable: the broker's load says why
        await self.client.control(op)

    def entry(self, name: str, version: int = -1) -> S.ModelEntry:
        """The model version an inference goes to (it may be restarting: the broker queues)."""
        return self.client.table.resolve(name, version, restarting_ok=True)

    # ---------------------------------------------------------------- validation

    def _required(self, view: S.ModelView) -> list[str]:
        """The view's required inputs, found once per view (a new model table brings new views)."""
        cached = self._required_inputs.get(id(view))
        if cached is not None and cached[0] is view:
            return cached[1]
        required = [n for n, i in view.inputs.items() if not i.optional]
        if len(self._required_inputs) >= MAX_CACHED_VIEWS:
            self._required_inputs.clear()
        self._required_inputs[id(view)] = (view, required)
        return required

    def validate(self, entry: S.ModelEntry, inputs: list[InputTensor], outputs: list[OutputRequest],
                 request_id: str) -> None:
        """Triton's request normalization checks, in Triton's order, with its messages."""
        view = entry.view or _NO_VIEW
        model = entry.name
        config_inputs = view.inputs
        if len(inputs) > 1:
            seen: set[str] = set()
            for t in inputs:
                if t.name in seen:
                    raise invalid(f"{prefix(request_id)}input '{t.name}' already exists in request")
                seen.add(t.name)
        if outputs:
            requested: set[str] = set()
            for o in outputs:
                if o.name in requested:
                    raise invalid(f"{prefix(request_id)}output '{o.name}' already exists in request")
                requested.add(o.name)
            config_outputs = view.outputs
            for o in outputs:
                if o.name not in config_outputs:
                    raise invalid(f"unexpected inference output '{o.name}' for model '{model}'")
        required = self._required(view)
        total = len(config_inputs)
        if len(inputs) > total or len(inputs) < len(required):
            if len(required) == total:
                head = f"expected {total} inputs"
            else:
                head = f"expected number of inputs between {len(required)} and {total}"
            names = {t.name for t in inputs}
            got = ",".join(f"'{t.name}'" for t in inputs)
            miss = ",".join(f"'{n}'" for n in required if n not in names)
            raise invalid(f"{prefix(request_id)}{head} but got {len(inputs)} inputs for model '{model}'. Got "
                          f"input(s) [{got}], but missing required input(s) [{miss}]. Please provide all required "
                          f"input(s).")
        for t in inputs:
            if t.name not in config_inputs:
                raise invalid(f"unexpected inference input '{t.name}' for model '{model}'")
        mbs = view.max_batch_size
        if mbs > 0:
            batch = None
            for t in inputs:
                if config_inputs[t.name].shape_tensor:
                    continue
                if not t.shape:
                    raise invalid(f"{prefix(request_id)}input '{t.name}' has no shape but model requires batch "
                                  f"dimension for '{model}'")
                if batch is None:
                    batch = t.shape[0]
                elif t.shape[0] != batch:
                    raise invalid(f"{prefix(request_id)}input '{t.name}' batch size does not match other inputs "
                                  f"for '{model}'")
            if batch is not None and batch > mbs:
                raise invalid(f"{prefix(request_id)}inference request batch-size must be <= {mbs} for '{model}'")
            if batch == 0:
                raise invalid(f"{prefix(request_id)}inference request batch-size must be > 0 for '{model}'")
        # Triton checks inputs in its hash map's order, which for a request's few inputs is last to
        # first: a request with several bad inputs names the one Triton names.
        for t in reversed(inputs):
            self._validate_input(t, config_inputs[t.name], model, mbs, request_id)

    @staticmethod
    def _validate_input(t: InputTensor, ci: S.TensorView, model: str, mbs: int, request_id: str) -> None:
        datatype = t.datatype
        if datatype not in WIRE_TYPES:
            raise invalid(f"{prefix(request_id)}invalid datatype '{datatype}' for input '{t.name}' for model "
                          f"'{model}'")
        if datatype != ci.datatype:
            raise invalid(f"{prefix(request_id)}inference input '{t.name}' data-type is '{datatype}', but model "
                          f"'{model}' expects '{ci.datatype}'")
        dims = ci.dims
        shape = t.shape
        body = shape[1:] if mbs > 0 and not ci.shape_tensor else shape
        if shape and min(shape) < 0:
            raise invalid(f"{prefix(request_id)}All input dimensions should be specified for input '{t.name}' for "
                          f"model '{model}', got {dims_str(shape)}")
        if body != dims and (len(body) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, body))):
            note = ""
            if mbs > 0:
                note = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
                        "dimension to be prepended to each input shape. If you want to specify the full "
                        "shape including the batch dim in your input dims config, try setting "
                        "max_batch_size to zero. See the model configuration docs for more info on "
                        "max_batch_size.")
            expected_full = ([-1] + dims) if mbs > 0 else dims
            raise invalid(f"{prefix(request_id)}unexpected shape for input '{t.name}' for model '{model}'. "
                          f"Expected {dims_str(expected_full)}, got {dims_str(shape)}. {note}")
        try:
            count = element_count(shape)
        except ValueError:
            raise invalid(f"{prefix(request_id)}invalid shape for input '{t.name}' for model '{model}': shape "
                          f"{dims_str(shape)} causes total element count to exceed maximum size") from None
        if datatype == "BYTES":
            if not t.region:
                count_bytes_elements(t.data, t.name, model, request_id, count)
            return
        size = t.nbytes if t.region else (len(t.data) if t.data is not None else 0)
        expected_size = count * ELEMENT_SIZE[datatype]
        if size != expected_size:
            raise invalid(f"{prefix(request_id)}input byte size mismatch for input '{t.name}' for model "
                          f"'{model}'. Expected {expected_size}, got {size}")

    # ---------------------------------------------------------------- execution

    def _request(self, entry: S.ModelEntry, inputs: list[InputTensor], outputs: list[OutputRequest],
                 opts: RequestOptions, window: int = 0) -> tuple[S.Infer, list]:
        """The Infer message, its tensors inline when small, else copied once into this
        frontend's arena (the blocks, returned, are freed once the broker answered)."""
        blocks = []
        descs = []
        inline_total = 0
        try:
            for t in inputs:
                loc: S.Loc
                if t.region:
                    loc = S.Region(t.region, t.offset, t.nbytes)
                else:
                    n = len(t.data)
                    if n <= S.INLINE_MAX and inline_total + n <= S.INLINE_BUDGET:
                        loc = S.Inline(bytes(t.data))
                        inline_total += n
                    elif t.at is not None:
                        loc = t.at
                    else:
                        block = self.arena.alloc(n)
                        blocks.append(block)
                        block.view[:n] = t.data
                        loc = S.Block(block.seg, block.offset, n)
                descs.append(S.TensorDesc(t.name, t.datatype, list(t.shape), loc))
        except BaseException:
            self._free(blocks)
            raise
        specs = [S.OutputSpec(o.name, o.classification,
                              region=S.Region(o.region, o.offset, o.nbytes) if o.region else None)
                 for o in outputs]
        key = b""
        if entry.view is not None and entry.view.response_cache and not any(t.region for t in inputs) \
                and not any(o.region for o in outputs):
            key = cache_key(inputs)
        msg = S.Infer(self.client.next_id(entry.name), entry.name, entry.version, descs, specs, opts.id,
                      opts.params, opts.priority, opts.timeout_us, opts.correlation_id, opts.flags, window,
                      key, opts.trace)
        return msg, blocks

    async def infer(self, entry: S.ModelEntry, inputs: list[InputTensor], outputs: list[OutputRequest],
                    opts: RequestOptions, held: Block | None = None) -> InferResult:
        """`held`: a block of this frontend's arena that inputs' bytes already lie in (their
        `at`), now this request's to free with the blocks it allocates."""
        try:
            self.validate(entry, inputs, outputs, opts.id)
            msg, blocks = self._request(entry, inputs, outputs, opts)
        except BaseException:
            if held is not None:
                self._free([held])
            raise
        if held is not None:
            blocks.append(held)
        try:
            # a caller that went away leaves its input blocks (inline inputs have none) to be
            # freed once the broker answered
            orphaned = (lambda held=blocks: self._free(held)) if blocks else None
            reply = await self.client.infer(msg, on_orphan=orphaned)
        except asyncio.CancelledError:
            blocks = []   # the broker still holds the request: freed when it answers
            if opts.on_cancelled is not None:
                self.client.after_cancel(msg.rid, opts.on_cancelled)
            raise
        finally:
            self._free(blocks)
        if reply.error is not None:
            raise reply.error
        try:
            return self._outputs(entry, outputs, opts, reply)
        except Exception:
            self.client.release_outputs(reply)
            raise

    async def infer_stream(self, entry: S.ModelEntry, inputs: list[InputTensor], outputs: list[OutputRequest],
                           opts: RequestOptions, window: int = STREAM_WINDOW) -> AsyncIterator[Streamed]:
        """A request's replies as they come (a decoupled model's 0..N responses, then the end).

        Each item is written out by the consumer before it asks for the next: only then are its
        outputs released and the model credited for another, so at most `window` replies wait
        in this process. Leaving early (client gone) cancels the request."""
        self.validate(entry, inputs, outputs, opts.id)
        msg, blocks = self._request(entry, inputs, outputs, opts, window)
        try:
            stream = self.client.open_stream(msg)
        except BaseException:
            self._free(blocks)
            raise
        try:
            while True:
                reply = await stream.next()
                if reply.error is not None:
                    item = Streamed(None, reply.error, not reply.more)
                elif reply.empty:
                    item = Streamed(None, None, not reply.more)
                else:
                    try:
                        item = Streamed(self._outputs(entry, outputs, opts, reply), None, not reply.more)
                    except TritonError as e:
                        self.client.release_outputs(reply)
                        item = Streamed(None, e, not reply.more)
                try:
                    yield item
                finally:
                    if item.result is not None:
                        self.release(item.result)
                stream.written()
                if item.final:
                    return
        finally:
            if stream.finished or stream.error is not None:
                self._free(blocks)
            else:
                stream.cancel(on_orphan=lambda held=blocks: self._free(held))

    def _outputs(self, entry: S.ModelEntry, outputs: list[OutputRequest], opts: RequestOptions,
                 reply: S.InferReply) -> InferResult:
        wanted = {o.name: o for o in outputs}
        result_outputs = []
        for d in reply.outputs:
            if wanted and d.name not in wanted:
                continue            # a cached response holds every output; only those asked go back
            loc = d.loc
            region = ""
            if isinstance(loc, S.Inline):
                data = loc.data
            elif isinstance(loc, S.Region):
                data, region = None, loc.name
            elif isinstance(loc, S.Block):
                data = self.maps.view(loc.seg, loc.offset, loc.nbytes)
            else:       # device memory is only ever handed to workers
                raise internal(f"output '{d.name}' was left in device memory")
            o = wanted.get(d.name)
            result_outputs.append(OutputTensor(d.name, d.datatype, list(d.shape), data, region,
                                               o.binary if o else None))
        if outputs:
            order = {o.name: i for i, o in enumerate(outputs)}
            result_outputs.sort(key=lambda t: order.get(t.name, 1 << 30))
        for o in outputs:
            if o.classification:
                self._classify(result_outputs, o, entry)
        return InferResult(entry.name, reply.version, opts.id, result_outputs, reply, reply.parameters)

    def _free(self, blocks: list) -> None:
        for block in blocks:
            self.arena.free(block.seg, block.offset)

    def _classify(self, outputs: list[OutputTensor], req: OutputRequest, entry: S.ModelEntry) -> None:
        for i, t in enumerate(outputs):
            if t.name == req.name:
                batching = entry.view is not None and entry.view.max_batch_size > 0
                labels = output_labels(self.client.table.resolve, entry, t.name)
                shape, data = classify(t.datatype, t.as_numpy(), req.classification, batching, labels)
                outputs[i] = OutputTensor(t.name, "BYTES", shape, data, "", t.binary)

    def release(self, result: InferResult) -> None:
        """Tell the worker its output blocks may be reused (after the response was built)."""
        if result.reply is not None:
            self.client.release_outputs(result.reply)
            result.reply = None
