"""Every message that crosses ZeroMQ, as typed msgspec Structs.

Frames are msgpack of a tagged union, decoded against these types, so a malformed or
hostile frame fails to decode instead of reaching any handler. No pickle anywhere.
Tensor bytes never travel here, except tiny tensors inline (`TensorDesc.data`).
"""
from __future__ import annotations

from typing import Any, Union

import msgspec

# Inline tensors up to this size ride inside the message; larger ones go through shm.
INLINE_MAX = 64 * 1024
# At most this many inline bytes per message a frontend or worker builds; the rest go by shm.
INLINE_BUDGET = 1 << 20
# Largest frame the broker and frontends accept from their peers (inline budgets keep every
# message they send far below it). Workers take any frame from the broker: an Exec of a big
# batch carries the inline tensors of all its requests.
MAX_FRAME = 16 << 20


class _S(msgspec.Struct, array_like=True, omit_defaults=True):
    pass


class TensorDesc(_S):
    """A tensor: inline bytes, a block of an internal segment, a client region, or device memory."""
    name: str
    datatype: str
    shape: list[int]
    data: bytes | None = None
    seg: str = ""          # internal segment name, or the client region's shm key once resolved
    offset: int = 0
    nbytes: int = 0
    lease: int = 0         # owner's block id to release when done (0: nothing to release)
    region: str = ""       # client-registered region name (system shared memory)
    cuda_handle: bytes = b""   # CUDA IPC handle of the device allocation holding the tensor (at `offset`)
    device: int = 0            # GPU of that allocation


class OutputSpec(_S):
    name: str
    region: str = ""
    seg: str = ""
    offset: int = 0
    nbytes: int = 0
    classification: int = 0
    device_ok: bool = False    # the consumer opens device memory: a GPU output may stay there (CUDA IPC)


class Err(_S):
    code: str               # Triton code name: INVALID_ARG, UNAVAILABLE, INTERNAL, ...
    message: str


# ---------------------------------------------------------------- frontend <-> broker

class Hello(_S, tag="hello"):
    kind: str               # http | grpc | supervisor | worker
    pid: int


class Infer(_S, tag="infer"):
    rid: int
    model: str
    version: int = -1
    inputs: list[TensorDesc] = []
    outputs: list[OutputSpec] = []
    id: str = ""
    params: dict[str, Any] = {}
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0


class InferReply(_S, tag="reply"):
    rid: int
    version: int = 0
    outputs: list[TensorDesc] = []
    error: Err | None = None
    owner: bytes = b""      # identity that holds the output leases


class Release(_S, tag="release"):
    owner: bytes
    leases: list[int]


class Control(_S, tag="control"):
    cid: int
    op: str
    args: dict[str, Any] = {}


class ControlReply(_S, tag="creply"):
    cid: int
    result: Any = None
    error: Err | None = None


class ModelEntry(_S):
    name: str
    version: int
    state: str              # READY | UNAVAILABLE | LOADING | UNLOADING
    reason: str = ""
    config: dict[str, Any] | None = None


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


# ---------------------------------------------------------------- broker <-> worker

class ExecRequest(_S):
    inputs: list[TensorDesc]
    outputs: list[OutputSpec] = []
    id: str = ""
    params: dict[str, Any] = {}
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0


class Exec(_S, tag="exec"):
    bid: int
    requests: list[ExecRequest]


class ExecResult(_S):
    outputs: list[TensorDesc] = []
    error: Err | None = None


class BatchDone(_S, tag="done"):
    bid: int
    results: list[ExecResult]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


class WorkerUp(_S, tag="up"):
    pid: int
    config: dict[str, Any] | None = None   # completed config (python auto_complete_config)


class WorkerDown(_S, tag="down"):
    reason: str


class Heartbeat(_S, tag="hb"):
    busy_ns: int = 0


class Stop(_S, tag="stop"):
    pass


class Gone(_S, tag="gone"):
    """Segments with this name prefix were unlinked (their owner died): drop any mapping."""
    prefix: str


class Unmap(_S, tag="unmap"):
    """Drop cached mappings of client regions that were unregistered."""
    keys: list[str]


FrontendMsg = Union[Hello, Infer, Release, Control]
BrokerToFrontend = Union[Table, InferReply, ControlReply, Ping, Gone]
WorkerMsg = Union[WorkerUp, WorkerDown, BatchDone, Heartbeat, Infer, Release]
BrokerToWorker = Union[Exec, Release, Stop, InferReply, Unmap, Gone]

encode = msgspec.msgpack.Encoder().encode


def decoder(union: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(union)


DecodeError = msgspec.DecodeError
