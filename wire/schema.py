"""Every message that crosses ZeroMQ between tritond's processes, as typed msgspec Structs.

Frames are msgpack of tagged unions decoded against these types, so a malformed or hostile
frame fails to decode instead of reaching a handler; never pickle. Tensor bytes do not travel
here, except small tensors inline. `PROTOCOL_VERSION` is exchanged in `Hello` (frontends,
supervisor) and `WorkerUp` (workers): a broker built from other code refuses the peer clearly
instead of misreading its frames. `Hello`'s first three fields never change shape.

Directions:
  frontend/supervisor -> broker   Hello, Infer, Release, Control, Cancel, Credit, TraceDone
  broker -> frontend/supervisor   Table, Ping, InferReply (or several as Replies), ControlReply, Gone,
                                  Refused, Observe
  worker -> broker                WorkerUp, WorkerDown, Heartbeat, BatchDone, Infer (BLS), Release,
                                  Cancel (BLS), Respond (on its stream socket)
  broker -> worker                Exec, Stop, Release, InferReply (BLS), Unmap, Gone, Observe,
                                  EndSequences; CancelKeys and Grant on its heartbeat socket

A control operation is answered by a ControlReply whose result is one of replies.py's Structs.
A request may be answered by several InferReply messages (a decoupled model's responses): all
but the last carry `more`. A worker sends a decoupled model's responses as `Respond` messages on
a third socket while it runs (its main thread may be busy in execute()); the broker talks to
the worker's heartbeat thread, never to its busy main thread, about requests that execute.
"""
from __future__ import annotations

import enum
from typing import Any, TypeAlias, Union

import msgspec

from .errors import Code, TritonError
from .replies import ControlResult

PROTOCOL_VERSION = 21
# Inline tensors up to this size ride inside the message; larger ones go through shm. Where
# the two cost the same CPU per request (HTTP binary, c=16): below it a block's allocation,
# lease and release cost more than copying the bytes through every hop; above it, less.
INLINE_MAX = 16 * 1024
# At most this many inline bytes per message a frontend or worker builds; the rest go by shm.
INLINE_BUDGET = 1 << 20
# Largest frame the broker and frontends accept from their peers (inline budgets keep every
# message they send far below it). Workers take any frame from the broker: an Exec of a big
# batch carries the inline tensors of all its requests.
MAX_FRAME = 16 << 20
# A worker's heartbeat socket has its identity plus this suffix, its stream socket the other.
HEARTBEAT_SUFFIX = b":hb"
STREAM_SUFFIX = b":rs"


class _S(msgspec.Struct, array_like=True, omit_defaults=True):
    """The per-request messages that hold no error are gc=False: the cycle collector never tracks
    them (it would scan every request a broker holds), and they cannot be part of a cycle, since
    they hold only scalars, bytes and each other. A message with a TritonError keeps gc: the
    error's traceback may reach a frame that holds the message (perf/bench_wire.py measures it)."""


# ---------------------------------------------------------------- where a tensor's bytes are

class Inline(_S, tag="i", gc=False):
    data: bytes


class Block(_S, tag="b", gc=False):
    """A block of one of this server's segments; `lease` is the owner's id to release (0: none)."""
    seg: str
    offset: int
    nbytes: int
    lease: int = 0


class Region(_S, tag="r", gc=False):
    """A client-registered region. Senders name it and an offset inside it; the broker checks
    the bounds and sets `key` (the segment workers map) with `offset` made absolute."""
    name: str
    offset: int
    nbytes: int
    key: str = ""


class Device(_S, tag="d", gc=False):
    """Device memory handed over by CUDA IPC handle, under the owner's `lease`."""
    handle: bytes
    device: int
    offset: int
    nbytes: int
    lease: int = 0


class Zeros(_S, tag="z", gc=False):
    """Zero bytes of the descriptor's shape: the inputs of a padding request in a sequence
    batch. Only the broker writes it; it carries no memory."""


Loc = Union[Inline, Block, Region, Device, Zeros]


class TensorDesc(_S, gc=False):
    name: str
    datatype: str
    shape: list[int]
    loc: Loc


def lease_of(desc: TensorDesc) -> int:
    """The owner's lease on a descriptor's memory (0: nothing to release)."""
    loc = desc.loc
    return loc.lease if isinstance(loc, (Block, Device)) else 0


class OutputSpec(_S, gc=False):
    name: str
    classification: int = 0
    device_ok: bool = False    # the consumer opens device memory: a GPU output may stay there
    region: Region | None = None


# ---------------------------------------------------------------- frontend <-> broker

class Hello(_S, tag="hello"):
    proto: int
    kind: str               # http | grpc | supervisor
    pid: int


class Refused(_S, tag="refused"):
    """The broker will not talk to this peer (another protocol version)."""
    reason: str


class TraceStart(_S, gc=False):
    """A frontend's part of a request that may be traced: when it was received."""
    recv_start: int             # monotonic ns
    recv_end: int
    protocol: str = "HTTP"      # HTTP | GRPC: names the timestamps
    forced: bool = False        # the client sent a trace context: traced whatever the rate
    context: str = ""           # OpenTelemetry: the W3C context the model's span will have (JSON)


# A request parameter's value, as Triton's parameters take them (bool, int64, double, string).
Param: TypeAlias = Union[bool, int, float, str]
# Triton's ModelConfig as JSON (protobuf's json_format of the parsed and completed config.pbtxt).
# It stays a JSON object rather than Structs: it is Triton's open-ended schema (hundreds of
# nested fields, backend-specific parameters) served verbatim by the model-config endpoints and
# handed to backends as Triton hands it; what tritond decides by is parsed once into ModelView.
ModelConfigJson: TypeAlias = dict[str, Any]


class Stamp(_S, gc=False):
    name: str                   # Triton's timestamp names: REQUEST_START, QUEUE_START, ...
    ns: int                     # monotonic ns, comparable across this host's processes


class Infer(_S, tag="infer", gc=False):
    rid: int
    model: str
    version: int = -1
    inputs: list[TensorDesc] = []
    outputs: list[OutputSpec] = []
    id: str = ""
    params: dict[str, Param] = {}
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    window: int = 0         # streamed replies the requester buffers before its Credit (0: no bound)
    cache_key: bytes = b""          # digest of the inputs (frontends only; response cache)
    trace: TraceStart | None = None
    parent_trace: int = 0           # a BLS call made with its request's trace(): that trace's id


class TraceRef(_S, gc=False):
    """A traced request's trace as its model sees it: BLS calls made with it are traced as its
    children; `context` is what request.trace().get_context() answers (OpenTelemetry mode)."""
    id: int
    context: str = ""


class TraceChild(_S, gc=False):
    """The trace of a request a traced request made (an ensemble step's), in OpenTelemetry mode:
    the frontend exports its spans below its parent's."""
    id: int
    parent_id: int
    model: str
    version: int
    stamps: list[Stamp] = []


class TraceInfo(_S, gc=False):
    """A traced request's id and the timestamps the broker and the worker took (and, in
    OpenTelemetry mode, its children's traces)."""
    id: int
    stamps: list[Stamp] = []
    children: list[TraceChild] = []


class InferReply(_S, tag="reply"):
    rid: int
    version: int = 0
    outputs: list[TensorDesc] = []
    error: TritonError | None = None
    owner: bytes = b""      # identity that holds the output leases
    more: bool = False      # more replies of this request follow
    empty: bool = False     # no response, only the end of the request's replies
    trace: TraceInfo | None = None
    parameters: dict[str, int | str | bool] = {}     # the response's own parameters


# With several brokers, a trace id's bits from here up name the broker that traces it.
TRACE_SHARD_SHIFT = 40


class TraceDone(_S, tag="trace_done", gc=False):
    """The frontend's last timestamps of a traced request (the response was sent)."""
    id: int
    stamps: list[Stamp] = []


class Replies(_S, tag="replies"):
    """Several replies to one frontend, sent as one frame (those the broker made in one turn)."""
    replies: list[InferReply]


class Cancel(_S, tag="cancel", gc=False):
    """The requester gave up on request `rid` (client disconnect, gRPC cancel)."""
    rid: int


class Credit(_S, tag="credit", gc=False):
    """The requester wrote `n` more streamed replies of request `rid`: the model may send as
    many more."""
    rid: int
    n: int


class Release(_S, tag="release", gc=False):
    owner: bytes
    leases: list[int]


# One struct per control operation.

class RepositoryIndex(_S, tag="index"):
    ready: bool = False


class LoadModel(_S, tag="load"):
    name: str
    config: str | None = None          # JSON of a ModelConfig replacing config.pbtxt for this load
    override_dir: str = ""             # `file:` overrides, written by the frontend (repository/overrides.py)


class UnloadModel(_S, tag="unload"):
    name: str
    unload_dependents: bool = False


class Statistics(_S, tag="stats"):
    name: str = ""
    version: int = -1


class ModelMetrics(_S, tag="metrics"):
    pass


class ShmRegister(_S, tag="shm_register"):
    name: str
    key: str
    offset: int
    byte_size: int


class ShmUnregister(_S, tag="shm_unregister"):
    name: str = ""


class ShmStatus(_S, tag="shm_status"):
    name: str = ""


class CudaRegister(_S, tag="cuda_register"):
    name: str
    raw_handle: bytes
    device_id: int
    byte_size: int


class CudaUnregister(_S, tag="cuda_unregister"):
    name: str = ""


class CudaStatus(_S, tag="cuda_status"):
    name: str = ""


class LogSettings(_S, tag="log_settings"):
    """The logging API's JSON object as the client sent it: the broker checks each key and
    value with Triton's error texts, which a typed decode here would replace."""
    settings: dict[str, Any] = {}


class TraceSettings(_S, tag="trace_settings"):
    """The trace API's settings as the client sent them (checked as LogSettings' are)."""
    model: str = ""
    settings: dict[str, Any] = {}


class ModelReady(_S, tag="model_ready"):
    """Is this version ready, by its model's own is_ready() (asked only of models that have one)?"""
    name: str
    version: int = -1


class MetricFamilyNew(_S, tag="metric_family"):
    """A model's pb_utils.MetricFamily: made, or found by its name (answered with its id)."""
    name: str
    description: str
    kind: int               # pb_utils.MetricFamily.COUNTER, GAUGE or HISTOGRAM


class MetricNew(_S, tag="metric_new"):
    """A family's metric by its labels: made, or found (answered with its id)."""
    family: int
    labels: dict[str, str] = {}
    buckets: list[float] | None = None      # a histogram's


class MetricOp(_S, tag="metric_op"):
    """increment, set, observe or value (answered with the metric's value)."""
    metric: int
    op: str
    value: float = 0.0


class MetricDrop(_S, tag="metric_drop"):
    """A model let a family or a metric go (its Python object was deleted); not answered."""
    family: int = 0
    metric: int = 0


class ReopenLog(_S, tag="reopen_log"):
    """Reopen the log file everywhere (SIGUSR1, after logrotate moved it)."""


class Drain(_S, tag="drain"):
    pass


class StopServer(_S, tag="stop"):
    pass


ControlOp = Union[RepositoryIndex, LoadModel, UnloadModel, Statistics, ModelMetrics, ShmRegister,
                  ShmUnregister, ShmStatus, CudaRegister, CudaUnregister, CudaStatus, LogSettings,
                  TraceSettings, ReopenLog, Drain, StopServer, ModelReady, MetricFamilyNew, MetricNew, MetricOp,
                  MetricDrop]


class Control(_S, tag="control"):
    cid: int
    op: ControlOp


class ControlReply(_S, tag="creply"):
    cid: int
    result: ControlResult = None
    error: TritonError | None = None


# ---------------------------------------------------------------- the model table

class ModelState(enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class QueuePolicy(_S, frozen=True):
    timeout_action: str = "REJECT"     # REJECT | DELAY
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


class DynamicBatching(_S):
    preferred: list[int] = []
    max_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    level_policies: dict[int, QueuePolicy] = {}


class TensorView(_S):
    name: str
    datatype: str                   # wire name: FP32, BYTES, ...
    dims: list[int]
    optional: bool = False
    shape_tensor: bool = False
    ragged: bool = False
    labels: list[str] = []          # an output's label_filename lines (classification)


class SequenceControl(_S):
    """One control input of the sequence batcher: the tensor the model reads and its values."""
    name: str
    datatype: str                   # wire name; CORRID: UINT64, INT64, UINT32, INT32 or BYTES
    false: float = 0
    true: float = 1


class SequenceBatching(_S):
    """`sequence_batching` as the broker schedules it."""
    oldest: bool = False
    max_idle_us: int = 1_000_000
    max_delay_us: int = 0
    min_slot_utilization: float = 0.0               # direct
    max_candidates: int = 0                         # oldest (0: max(1, max_batch_size))
    preferred: list[int] = []                       # oldest
    preserve_ordering: bool = False                 # oldest
    controls: dict[str, SequenceControl] = {}       # START | END | READY | CORRID -> control
    states: list[str] = []                          # implicit state inputs (kept by the worker)
    iterative: bool = False                         # iterative_sequence: the model may reschedule requests


class ModelView(_S):
    """What every process needs to know of a model's config, parsed once by the broker."""
    max_batch_size: int = 0
    platform: str = ""
    backend: str = ""
    ensemble: bool = False
    decoupled: bool = False
    inputs: dict[str, TensorView] = {}
    outputs: dict[str, TensorView] = {}
    batching: DynamicBatching | None = None
    exec_timeout_s: float = 60.0
    idempotent: bool = False
    response_cache: bool = False    # the server's cache is on and the config enables it
    sequence: SequenceBatching | None = None


class ModelEntry(_S):
    name: str
    version: int
    state: ModelState
    reason: str = ""
    unloaded: bool = False          # UNAVAILABLE because it was unloaded, not because it failed
    view: ModelView | None = None
    config: ModelConfigJson | None = None
    restarting: bool = False        # UNAVAILABLE while its instances restart; requests still queue
    ready_hook: bool = False        # its model defines is_ready(): readiness is asked of its workers


class Table(_S, tag="table"):
    """The model table every frontend validates against; resent whenever it changes."""
    epoch: int
    models: list[ModelEntry]
    names: list[str]        # every model name in the repository, loaded or not
    startup_done: bool
    stopping: bool = False
    boot: int = 0           # the broker's pid: a new value means the broker was restarted


class Ping(_S, tag="ping"):
    boot: int = 0


LOG_FORMATS = ("default", "ISO8601", "json")


class LogConfig(msgspec.Struct, frozen=True, omit_defaults=True):
    """The log settings every process applies (Triton's logging API keys)."""
    info: bool = True
    warning: bool = True
    error: bool = True
    verbose: int = 0
    format: str = "default"          # default | ISO8601 | json
    file: str = ""                   # set at startup only, never over the network
    generation: int = 0              # bumped to make every process reopen the file


class Observe(_S, tag="observe"):
    """Live log settings, and the trace mode frontends stamp requests for, per model ("" key:
    models without settings of their own; "" value: not tracing)."""
    log: LogConfig = LogConfig()
    tracing: dict[str, str] = {}


class Gone(_S, tag="gone"):
    """Segments with this name prefix were unlinked (their owner died): drop any mapping."""
    prefix: str


# ---------------------------------------------------------------- broker <-> worker

class WorkerSpec(msgspec.Struct, omit_defaults=True):
    """What a worker process is started with (JSON on its command line)."""
    server_id: str
    workers: str                    # the broker's worker endpoint
    identity: str
    broker_pid: int
    model: str
    version: int
    model_dir: str
    version_dir: str
    repository: str
    config: ModelConfigJson
    instance_name: str
    kind: str = "CPU"
    device_id: int = 0
    log_verbose: int = 0
    log: LogConfig | None = None
    index: int = 0                  # the instance's place among the model's instances
    # The host's thread budget for this instance, decided when its version loads: its BLAS,
    # OpenMP and framework intra-op pools get `threads`, inter-op pools `inter_op_threads`
    # (0: not budgeted, the backend's own defaults).
    threads: int = 0
    inter_op_threads: int = 0
    # Explicit model control: where the model's own loads (pb_utils.load_model) write their
    # `file:` overrides, and how many bytes they may hold ("": the model may not load models).
    override_run_dir: str = ""
    override_max_bytes: int = 0
    runtime_dir: str = ""           # a Python-based backend's directory: its model.py runs the model


class ExecRequest(_S, gc=False):
    inputs: list[TensorDesc]
    outputs: list[OutputSpec] = []
    id: str = ""
    params: dict[str, Param] = {}
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    key: int = 0            # the broker's name for this request (cancellation, streamed replies)
    seq: int = 0            # the sequence whose implicit state it reads and writes (0: none)
    pad: bool = False       # padding of a sequence batch: executed, never answered
    window: int = 0         # streamed replies the model may send ahead of the requester's credit
    trace: TraceRef | None = None   # this request's, when it is traced


class Exec(_S, tag="exec", gc=False):
    """A batch to execute. `serial`: requests a default scheduler's queue handed over together,
    each executed on its own as if it had come alone (one message each way for several)."""
    bid: int
    requests: list[ExecRequest]
    serial: bool = False


class ExecResult(_S):
    outputs: list[TensorDesc] = []
    error: TritonError | None = None
    parameters: dict[str, int | str | bool] = {}     # the response's own (a Python model's)


class RunTimes(_S, gc=False):
    """One request's times in a serial Exec (BatchDone's own fields sum them)."""
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    start_ns: int = 0       # 0: not executed (cancelled while it waited its turn)


class BatchDone(_S, tag="done"):
    """One result per request that is not padding; none for a decoupled model, whose requests
    are answered by Respond messages (this only says the instance is free)."""
    bid: int
    results: list[ExecResult]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    start_ns: int = 0       # monotonic ns when the worker began (trace timestamps)
    runs: list[RunTimes] = []   # a serial Exec's times, one per request
    # A serial Exec's results so far, for its first requests not yet answered; the instance
    # is still busy with the rest (workers/runs.py).
    more: bool = False
    # An iterative sequence model's requests the model released to run again (their places in
    # the batch, padding left out): no answer yet, the sequence goes on.
    rescheduled: list[int] = []


class WorkerUp(_S, tag="up"):
    proto: int
    pid: int
    config: ModelConfigJson | None = None   # completed config (python auto_complete_config)
    ready_hook: bool = False                # the model defines is_ready() (a Python model may)


class CheckReady(_S, tag="check_ready", gc=False):
    """Run the model's is_ready() and answer with ReadyResult (on the stream socket)."""


class ReadyResult(_S, tag="ready_result"):
    ready: bool
    error: str = ""         # why not: is_ready() raised, or returned something not a bool


class WorkerDown(_S, tag="down"):
    reason: str


class Heartbeat(_S, tag="hb", gc=False):
    busy_ns: int = 0


class Stop(_S, tag="stop"):
    pass


class Unmap(_S, tag="unmap"):
    """Drop cached mappings of client regions that were unregistered."""
    keys: list[str]


class Respond(_S, tag="respond"):
    """One response of a decoupled model's request `key` (or only its end, `empty`)."""
    key: int
    outputs: list[TensorDesc] = []
    error: TritonError | None = None
    final: bool = False
    empty: bool = False
    parameters: dict[str, int | str | bool] = {}     # the response's own (a Python model's)


class CancelKeys(_S, tag="cancel_keys", gc=False):
    """These executing requests were cancelled: their `is_cancelled()` turns true."""
    keys: list[int]


class Grant(_S, tag="grant", gc=False):
    """Request `key` may send `n` more streamed responses."""
    key: int
    n: int


class EndSequences(_S, tag="end_seq"):
    """Free the implicit state of these sequences (idle, cancelled or force-ended)."""
    seqs: list[int]


FrontendMsg = Union[Hello, Infer, Release, Control, Cancel, Credit, TraceDone]
BrokerToFrontend = Union[Table, InferReply, Replies, ControlReply, Ping, Gone, Refused, Observe]
WorkerMsg = Union[WorkerUp, WorkerDown, BatchDone, Heartbeat, Infer, Release, Respond, Cancel, ReadyResult,
                  Control]
BrokerToWorker = Union[Exec, Release, Stop, InferReply, Unmap, Gone, Observe, EndSequences, CancelKeys, Grant,
                       CheckReady, ControlReply]


# ---------------------------------------------------------------- encoding

def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, TritonError):
        return (obj.code.value, obj.message)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is TritonError:
        if isinstance(obj, list) and len(obj) == 2 and all(isinstance(x, str) for x in obj):
            return TritonError(Code(obj[0]), obj[1])
        raise ValueError("an error must be [code, message]")
    raise NotImplementedError(f"cannot decode {tp.__name__}")


encode = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode


def decoder(union: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(union, dec_hook=_dec_hook)


DecodeError = msgspec.DecodeError


def heartbeat_identity(identity: bytes) -> bytes:
    return identity + HEARTBEAT_SUFFIX


def stream_identity(identity: bytes) -> bytes:
    return identity + STREAM_SUFFIX
