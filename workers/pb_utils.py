"""tritond's `triton_python_backend_utils`: the API Triton model.py files import as pb_utils.

The Python backend installs this module as sys.modules["triton_python_backend_utils"]
before importing a model, so unmodified Triton models run here. Names, int codes and
error texts follow Triton's python_backend, because model code compares and prints them.
Process-wide hooks (`set_bls_handler`, `set_model_dir`) are filled in by the worker.
"""
from __future__ import annotations

import asyncio
import enum
import itertools
import json
import sys
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tritond.repository.datatypes import WIRE_TO_NUMPY, deserialize_bytes, numpy_to_wire, serialize_bytes
from tritond.wire import schema as _wire

from .pb_config import (  # noqa: F401  (pb_utils' public names)
    Logger, LogLevel, ModelConfig, get_input_config_by_name, get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    """PreferredMemory kinds, with Triton's values (GPU=0, CPU=1)."""
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
    TRITONSERVER_MEMORY_DEFAULT = 2


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU

# TRITONSERVER_DataType codes, returned by Tensor.triton_dtype().
_WIRE_TO_CODE: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_CODE_TO_NUMPY: dict[int, type] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64,
    13: np.object_,
}

# The fixed-size dtypes' codes, looked up directly (the tensors of every request pass here).
_FIXED_DTYPE_TO_CODE: dict[np.dtype, int] = {
    WIRE_TO_NUMPY[wire]: code for wire, code in _WIRE_TO_CODE.items() if wire not in ("BYTES", "BF16")
}

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


class ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code values; `.name` is the code name the worker reports."""
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail (Triton raises the same type)."""


class TritonError:
    """An error carried by an InferenceResponse (not an exception, as in Triton)."""
    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError message and code must not be None")
        self._message = str(message)
        self._code = ErrorCode(code)

    def message(self) -> str:
        return self._message

    def code(self) -> ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"


# ---------------------------------------------------------------- datatypes

def triton_string_to_numpy(triton_type_string: str) -> type:
    """numpy type for a config data_type such as 'TYPE_FP32'."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """numpy type for a TRITONSERVER_DataType code (None when numpy has none)."""
    return _CODE_TO_NUMPY.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER_DataType code for a numpy dtype; str/bytes/object map to BYTES (13)."""
    if isinstance(data_type, np.dtype) and data_type in _FIXED_DTYPE_TO_CODE:
        return _FIXED_DTYPE_TO_CODE[data_type]
    try:
        return _WIRE_TO_CODE[numpy_to_wire(np.dtype(data_type))]
    except (TypeError, ValueError):
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """Triton's BYTES encoding of a str/bytes/object array, C order (None for other dtypes)."""
    if input_tensor.dtype.kind not in "OSU":
        return None
    return serialize_bytes(np.ascontiguousarray(input_tensor))


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Flat object array of bytes from Triton's BYTES encoding."""
    try:
        return deserialize_bytes(encoded_tensor)
    except ValueError as exc:
        raise TritonModelException(str(exc)) from None


def _as_bytes_objects(array: np.ndarray) -> np.ndarray:
    """str/bytes arrays as object arrays with str encoded to UTF-8: the one BYTES form used."""
    items = array.reshape(-1).tolist()
    if array.dtype == np.object_ and not any(isinstance(item, str) for item in items):
        return array
    out = np.empty(len(items), dtype=np.object_)
    out[:] = [item.encode("utf-8") if isinstance(item, str) else item for item in items]
    return out.reshape(array.shape)


class _Capsule:
    """Lets numpy consume a bare DLPack capsule (np.from_dlpack wants an object)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; numpy rejects capsules that point elsewhere


# ---------------------------------------------------------------- tensors

class Tensor:
    """A named CPU tensor backed by a numpy array (zero-copy for contiguous arrays). A BF16
    tensor holds its values' bits (uint16) and, as in Triton, goes to and from other frameworks
    by DLPack only (through torch, which numpy's DLPack cannot stand in for)."""
    _bf16 = False

    def __init__(self, name: str, numpy_array: Any) -> None:
        if not isinstance(name, str) or numpy_array is None:
            raise _incompatible("Tensor(name: str, numpy_array: numpy.ndarray)")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = np.asarray(numpy_array)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if array.dtype not in _FIXED_DTYPE_TO_CODE:
            if array.dtype.kind in "OSU":
                array = _as_bytes_objects(array)
            if numpy_to_triton_type(array.dtype) is None:
                raise TritonModelException("NumPy dtype is not supported.")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._bf16:
            raise TritonModelException("Tensor dtype is BF16 and cannot be converted to numpy. Use to_dlpack() "
                                       "and from_dlpack() instead.")
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def _wire(self) -> tuple[np.ndarray, str]:
        """The array and wire datatype a BLS request carries (a BF16 tensor: its bits)."""
        return self._array, "BF16" if self._bf16 else numpy_to_wire(self._array.dtype)

    def triton_dtype(self) -> int:
        """TRITONSERVER_DataType code, e.g. 11 for FP32 and 13 for BYTES."""
        return _WIRE_TO_CODE["BF16"] if self._bf16 else numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """DLPack capsule; read-only arrays are copied since DLPack cannot mark them read-only."""
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not have support for string tensors.")
        array = self._array if self._array.flags.writeable else self._array.copy()
        if self._bf16:
            torch = _torch()
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(array.view(np.int16)).view(torch.bfloat16))
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """Tensor from a DLPack capsule or an object with __dlpack__ (CPU memory only)."""
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        source = tensor if hasattr(tensor, "__dlpack__") else _Capsule(tensor)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            bits = _bf16_bits(tensor)       # numpy refuses BF16 (and leaves the capsule unused)
            if bits is None:
                raise TritonModelException(f"unable to import DLPack tensor '{name}': {exc}") from None
            return Tensor.bf16(name, bits)
        return Tensor(name, array)

    @staticmethod
    def bf16(name: str, bits: np.ndarray) -> Tensor:
        """A BF16 tensor of these bits (uint16)."""
        t = Tensor(name, bits)
        t._bf16 = True
        return t

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TritonModelException("a BF16 tensor goes to DLPack through torch, which is not installed") from None
    return torch


def _bf16_bits(source: Any) -> np.ndarray | None:
    """The bits of a CPU BF16 DLPack tensor, read through torch when the model has imported it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        t = torch.utils.dlpack.from_dlpack(source)
    except Exception:
        return None
    if t.dtype != torch.bfloat16 or t.device.type != "cpu":
        return None
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


# ---------------------------------------------------------------- requests and responses

def _incompatible(signature: str) -> TypeError:
    """What pybind11 raises for an argument of the wrong type (or None) in Triton's binding."""
    return TypeError(f"incompatible constructor arguments; supported: {signature}")


def _parameters_json(parameters: dict | None) -> str:
    """Validated JSON text of request/response parameters (Triton allows scalar values only)."""
    if not _checked_parameters(parameters):
        return "{}"
    return json.dumps(parameters)


def _checked_parameters(parameters: dict | None) -> dict | None:
    """The parameters (None when there are none), each key and value of a type Triton takes."""
    if not parameters:
        if parameters is not None and not isinstance(parameters, dict):
            raise TritonModelException(f"Expect dict, got {type(parameters)}")
        return None
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return parameters


class InferenceResponse:
    """Output tensors for one request, or an error."""

    def __init__(self, output_tensors: Sequence[Tensor] = (),
                 error: TritonError | None = None, parameters: dict | None = None) -> None:
        if output_tensors is None:
            raise _incompatible("InferenceResponse(output_tensors: list[Tensor] = [], error: TritonError "
                                "= None, parameters: dict = None)")
        if None in output_tensors:
            raise TritonModelException("Output tensor for inference response should not be empty.")
        self._output_tensors = list(output_tensors)
        self._error = error
        self._parameter_values = _checked_parameters(parameters)    # what the worker sends on

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """JSON text, as in Triton."""
        return json.dumps(self._parameter_values or {})


class PreferredMemory:
    """Where BLS outputs should live; tritond workers always return CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """Trace handle of a request: a BLS request built with it is traced as the request's child.
    In OpenTelemetry mode its context is the W3C trace context of the request's span (JSON with
    `traceparent`), as Triton gives it; None otherwise."""

    def __init__(self, trace_id: int = 0, context: str = "") -> None:
        self._id = trace_id
        self._context = context

    def get_context(self) -> str | None:
        return self._context or None


_DEFAULT_MEMORY = PreferredMemory(MemoryType.TRITONSERVER_MEMORY_DEFAULT)
_NO_TRACE = InferenceTrace()


class ResponseIterator:
    """What exec(decoupled=True) returns: the responses of one BLS call as they arrive (the
    last one may be empty: it only ends the call)."""

    def __init__(self, responses: Iterator[InferenceResponse], cancel: Callable[[], None] | None = None) -> None:
        self._responses = responses
        self._cancel = cancel

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def cancel(self) -> None:
        """Ask the callee to stop (its `is_cancelled()` turns true); responses already on their
        way still arrive."""
        if self._cancel is not None:
            self._cancel()


class ResponseSender:
    """What `request.get_response_sender()` returns: sends a request's responses (a decoupled
    model 0..N of them, then the final flag), from execute() or from any thread."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None], decoupled: bool,
                 is_cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._decoupled = decoupled
        self._is_cancelled = is_cancelled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"Expected an InferenceResponse, got {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response.")
                if response is None and final and self._sent == 0:
                    raise TritonModelException("Unable to send response. Non-decoupled model cannot send "
                                               "complete final before sending a response.")
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self._closed = final
            self._sent += 1
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._is_cancelled()

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """No more responses may be sent (the backend answered the request otherwise)."""
        with self._lock:
            self._closed = True


BlsHandler = Callable[..., tuple]
_bls_handler: BlsHandler | None = None
_bls_stream_handler: BlsHandler | None = None
_model_dir = ""
# Whether a model called set_release_flags() since the worker last looked (it looks only then).
release_flags_set = False


def set_bls_handler(handler: BlsHandler | None, stream_handler: BlsHandler | None = None) -> None:
    """Install the worker's BLS entry points.

    handler(model_name, model_version, inputs, requested_output_names, request_id,
    parameters, correlation_id, flags, timeout_us, trace_id)
      -> (outputs, tritond.wire.errors.TritonError | None, the response's parameters)
    where inputs and outputs map each tensor's name to (its array, its wire datatype): a BF16
    tensor is its bits (uint16) labelled BF16.
    stream_handler(same arguments) -> (iterator of (outputs, error, parameters), cancel callable)
    """
    global _bls_handler, _bls_stream_handler
    _bls_handler = handler
    _bls_stream_handler = stream_handler


_model_control: Any = None      # the worker's BlsClient: load_model, unload_model, is_model_ready


def set_model_control(control: Any) -> None:
    """Install the worker's model control (what a model may ask of the server itself)."""
    global _model_control
    _model_control = control


def _controlled(call: Callable[[Any], Any]) -> Any:
    if _model_control is None:
        raise TritonModelException("model control is not available")
    try:
        return call(_model_control)
    except TritonModelException:
        raise
    except Exception as e:      # the broker's TritonError, a file the override could not write
        raise TritonModelException(getattr(e, "message", None) or str(e)) from None


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload a model, as a client's load request (explicit model control): `config`
    is a ModelConfig's JSON, `files` the `file:<path>` overrides (with a config)."""
    _controlled(lambda c: c.load_model(model_name, config, files))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _controlled(lambda c: c.unload_model(model_name, unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the version ("": the latest) is ready, as a client's readiness request."""
    return _controlled(lambda c: c.is_model_ready(model_name, int(model_version) if model_version else -1))


class MetricFamily:
    """A family of custom metrics, shared by name with every model of the server (Triton's
    pb_utils.MetricFamily); its series appear on the metrics endpoint."""
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._id = 0
        self._id = _controlled(lambda c: c.metric_call(_wire.MetricFamilyNew(name, description, int(kind)))).id

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        """The family's metric with these labels (a histogram's with these bucket bounds)."""
        return Metric(self._id, labels, buckets)

    def __del__(self) -> None:
        _dropped(family=self._id)


class Metric:
    """One series of a MetricFamily; every operation acts on the value the server holds."""

    def __init__(self, family: int, labels: dict[str, str] | None, buckets: list[float] | None) -> None:
        self._id = 0
        op = _wire.MetricNew(family, {str(k): str(v) for k, v in (labels or {}).items()},
                             None if buckets is None else [float(b) for b in buckets])
        self._id = _controlled(lambda c: c.metric_call(op)).id

    def increment(self, value: float) -> None:
        self._op("increment", value)

    def set(self, value: float) -> None:
        self._op("set", value)

    def observe(self, value: float) -> None:
        self._op("observe", value)

    def value(self) -> float:
        return self._op("value", 0.0)

    def _op(self, op: str, value: float) -> float:
        return _controlled(lambda c: c.metric_call(_wire.MetricOp(self._id, op, float(value)))).value

    def __del__(self) -> None:
        _dropped(metric=self._id)


def _dropped(family: int = 0, metric: int = 0) -> None:
    control = _model_control
    if control is not None and (family or metric):
        try:
            control.metric_drop(family, metric)
        except Exception:       # the worker is closing: the broker drops its references anyway
            pass


def set_model_dir(path: str) -> None:
    """Record the directory holding model.py, for get_model_dir()."""
    global _model_dir
    _model_dir = path


def get_model_dir() -> str:
    """Directory holding the running model.py (Triton's version directory)."""
    return _model_dir


_REQUEST_SIGNATURE = ("InferenceRequest(request_id: str = '', correlation_id: int | str = 0, *, inputs: list[Tensor], "
                      "requested_output_names: list[str], model_name: str, ...)")


class InferenceRequest:
    """A request: received by execute(), or built by the model for BLS (exec/async_exec)."""

    def __init__(self, request_id: str = "", correlation_id: int | str = 0, *,
                 inputs: list[Tensor], requested_output_names: list[str], model_name: str,
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters: dict | None = None) -> None:
        names = None if requested_output_names is None else list(requested_output_names)
        if (type(request_id) is not str or correlation_id is None or inputs is None or names is None
                or not isinstance(model_name, (str, bytes))):
            raise _incompatible(_REQUEST_SIGNATURE)
        for n in names:
            if type(n) is not str:
                raise _incompatible(_REQUEST_SIGNATURE)
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        if None in inputs or "" in names:
            what = "Input tensor" if None in inputs else "Requested output name"
            raise TritonModelException(f"{what} for request with id '{request_id}' and model name "
                                       f"'{model_name}' should not be empty.")
        # bytes as Triton's binding takes them: a model name read from a BYTES input tensor
        self.model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = int(model_version)
        self._inputs = list(inputs)
        self._requested_output_names = names
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory or _DEFAULT_MEMORY
        self._trace = trace or _NO_TRACE
        self._parameters = _parameters_json(parameters)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._response_sender: ResponseSender | None = None
        self._cancelled: Callable[[], bool] | None = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        """Timeout in microseconds (0 = none)."""
        return self._timeout

    def parameters(self) -> str:
        """JSON text, as in Triton."""
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        """True once the requester gave up (client disconnect, gRPC cancel) while this executes."""
        return self._cancelled is not None and self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        global release_flags_set
        self._release_flags = int(flags)
        release_flags_set = True

    _sender_taken = False       # whether the model took the response sender (it may answer later)

    def get_response_sender(self) -> ResponseSender:
        """The sender of this request's responses (requests a model received only)."""
        if self._response_sender is None:
            raise TritonModelException("only a request the model received has a response sender")
        self._sender_taken = True
        return self._response_sender

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on another model through the worker (blocking); with `decoupled`,
        an iterator over its responses as they arrive, returned once the first one has (as
        Triton's: so `await async_exec(decoupled=True)` waits off the event loop, and several
        of them wait side by side)."""
        if not decoupled:
            return self._run_bls()
        handler = _bls_stream_handler
        if handler is None:
            return ResponseIterator(iter([InferenceResponse(error=TritonError("BLS is not available"))]))
        responses, cancel = handler(*self._bls_arguments())
        stream = (_bls_response(*response) for response in responses)
        first = next(stream, None)
        return ResponseIterator(itertools.chain([first], stream) if first is not None else stream, cancel)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future:
        """Awaitable exec(): the blocking call runs in the running loop's executor."""
        return asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)

    def _bls_arguments(self) -> tuple:
        return (self.model_name, self._model_version, {t.name(): t._wire() for t in self._inputs},
                list(self._requested_output_names), self._request_id, json.loads(self._parameters),
                self._correlation_id, self._flags, self._timeout, self._trace._id)

    def _run_bls(self) -> InferenceResponse:
        handler = _bls_handler
        if handler is None:
            return InferenceResponse(error=TritonError("BLS is not available"))
        try:
            outputs, error, parameters = handler(*self._bls_arguments())
        except TritonModelException:
            raise
        except Exception as exc:  # the caller gets an error response, as from Triton's Exec
            return InferenceResponse(error=TritonError(str(exc)))
        return _bls_response(outputs, error, parameters)


def _bls_response(outputs: dict[str, np.ndarray] | None, error: Any, parameters: dict | None) -> InferenceResponse:
    """A BLS reply as the model sees it (`error`: a tritond.wire.errors.TritonError)."""
    if error is not None:
        return InferenceResponse(error=TritonError(error.message, ErrorCode[error.code.name]))
    return InferenceResponse([Tensor.bf16(name, array) if datatype == "BF16" else Tensor(name, array)
                              for name, (array, datatype) in (outputs or {}).items()], parameters=parameters)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
