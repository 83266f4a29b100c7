"""Translation between the `inference` protobuf messages and the protocol-neutral dataplane.

The checks here are the ones Triton makes while reading a gRPC request (typed parameter
oneofs, where an input's data comes from, shared-memory parameters), with Triton's texts;
everything that does not depend on the wire format is left to `Dataplane.validate`.
"""
from __future__ import annotations

import re
import struct
from typing import Any, Iterable

import msgspec
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from tritond.repository.datatypes import WIRE_TO_NUMPY, WIRE_TYPES
from tritond.wire import replies as R
from tritond.wire import schema as S
from tritond.wire.errors import invalid

from ..dataplane import InferResult, InputTensor, OutputRequest, RequestOptions, split_parameters

INT64_MAX = (1 << 63) - 1
EMPTY_FINAL = "triton_enable_empty_final_response"

# Which typed `contents` field carries which wire datatype (FP16/BF16 only travel raw).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# A non-empty contents field names the datatype it holds; int/uint fields follow the declared
# datatype for the narrow integer types, as Triton does.
FIELD_TYPE = {
    "bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
    "uint_contents": "UINT32", "uint64_contents": "UINT64", "fp32_contents": "FP32",
    "fp64_contents": "FP64", "bytes_contents": "BYTES",
}
NARROW = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}

_LEADING_INT = re.compile(r"\s*[+-]?\d+")


def parse_version(text: str) -> int:
    """A request's version string as Triton reads it (std::stol): empty means latest (-1)."""
    if not text:
        return -1
    m = _LEADING_INT.match(text)
    value = int(m.group()) if m else None
    if value is None or not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise invalid(f"failed to get model version from specified version string '{text}' (details: stol), "
                      f"version should be an integral value > 0")
    if value < 0:
        raise invalid(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return value


# ---------------------------------------------------------------- request parameters

def request_options(params: Any) -> RequestOptions:
    """RequestOptions from `ModelInferRequest.parameters`, checking each oneof's type."""
    plain: dict[str, Any] = {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise invalid("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key == "priority":
            if kind == "int64_param":
                if p.int64_param < 0:
                    raise invalid("invalid value for 'priority', expected value >= 0.")
            elif kind != "uint64_param":
                raise invalid("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid("invalid value type for 'timeout' parameter, expected int64_param.")
        elif key.startswith("triton_"):
            if key != EMPTY_FINAL:
                raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                              f"following keys starting with 'triton_' are allowed: {EMPTY_FINAL}")
            if kind != "bool_param":
                raise invalid(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif kind not in ("int64_param", "bool_param", "string_param", "double_param"):
            raise invalid(f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                          f"string_param or double_param.")
        plain[key] = getattr(p, kind)
    return split_parameters(plain)


# ---------------------------------------------------------------- tensors

def _shm_params(tensor: Any) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) when the tensor uses a shared-memory region, else None."""
    params = tensor.parameters
    if not params:
        return None
    name = tensor.name
    region = None
    if "shared_memory_region" in params:
        p = params["shared_memory_region"]
        if p.WhichOneof("parameter_choice") != "string_param":
            raise invalid(f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
                          f"expected string_param.")
        region = p.string_param
    values = {}
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params:
            if region is None:
                raise invalid(f"'{key}' can not be specified without 'shared_memory_region' parameter for "
                              f"tensor '{name}'")
            p = params[key]
            if p.WhichOneof("parameter_choice") != "int64_param":
                raise invalid(f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param.")
            values[key] = p.int64_param
    if region is None:
        return None
    if "shared_memory_byte_size" not in values:
        raise invalid(f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
                      f"for tensor '{name}'")
    offset, size = values.get("shared_memory_offset", 0), values["shared_memory_byte_size"]
    if offset < 0 or size < 0:
        raise invalid(f"invalid shared memory parameters for tensor '{name}': offset and byte size must be >= 0")
    return region, offset, size


def _serialize_strings(items: Iterable[bytes]) -> bytes:
    parts = []
    for b in items:
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def _contents_bytes(io: Any, model: str) -> bytes:
    """The wire payload of an input given through the typed `contents` fields."""
    declared = io.datatype if io.datatype in WIRE_TYPES else "INVALID"
    data = b""
    supplied = False
    for field, ftype in FIELD_TYPE.items():
        values = getattr(io.contents, field)
        if not len(values):
            continue
        if supplied:
            raise invalid(f"unexpected explicit tensor data for input tensor '{io.name}' for model '{model}', "
                          f"binary data was already supplied.")
        narrow = declared in NARROW.get(field, ())
        if narrow:
            ftype = declared
        if ftype != declared:
            raise invalid(f"unexpected explicit tensor data for input tensor '{io.name}' for model '{model}' of "
                          f"type '{ftype}', expected datatype '{declared}'")
        # Converted value by value (np.fromiter): no list of Python objects 8x the payload.
        if ftype == "BYTES":
            data = _serialize_strings(values)
        elif narrow:  # keep the low bytes of each 32-bit value, as Triton does
            data = np.fromiter(values, np.int64, len(values)).astype(WIRE_TO_NUMPY[ftype]).tobytes()
        else:
            data = np.fromiter(values, WIRE_TO_NUMPY[ftype], len(values)).tobytes()
        supplied = True
    return data


def parse_inputs(request: Any, raw: list[memoryview] | None = None) -> list[InputTensor]:
    """InputTensors with data from shared memory, `contents`, or `raw_input_contents` (in that
    order); `raw`: those contents where the request was parsed without them (codec.py)."""
    model = request.model_name
    if raw is None:
        raw = request.raw_input_contents
    next_raw = 0
    inputs = []
    for io in request.inputs:
        t = InputTensor(io.name, io.datatype, list(io.shape))
        has_contents = io.HasField("contents")
        shm = _shm_params(io)
        if shm is not None:
            if has_contents:
                raise invalid(f"unexpected 'content' provided when using shared memory for input tensor "
                              f"'{io.name}' for model '{model}'")
            t.region, t.offset, t.nbytes = shm
        elif has_contents:
            if len(raw):
                raise invalid(f"contents field must not be specified when using raw_input_contents for "
                              f"'{io.name}' for model '{model}'")
            t.data = _contents_bytes(io, model)
        elif next_raw < len(raw):
            t.data = raw[next_raw]
            next_raw += 1
        else:
            raise invalid(f"unable to find data for input tensor '{io.name}' for model '{model}' in request.")
        inputs.append(t)
    return inputs


def parse_outputs(request: Any) -> list[OutputRequest]:
    outputs = []
    for o in request.outputs:
        out = OutputRequest(o.name)
        shm = _shm_params(o)
        if "classification" in o.parameters:
            p = o.parameters["classification"]
            if p.WhichOneof("parameter_choice") != "int64_param":
                raise invalid("invalid value type for 'classification' parameter, expected int64_param")
            if p.int64_param <= 0:
                raise invalid("invalid value for 'classification' parameter, expected >= 1")
            if shm is not None:
                raise invalid("output can't set both 'shared_memory_region' and 'classification'")
            out.classification = min(p.int64_param, (1 << 32) - 1)
        if shm is not None:
            out.region, out.offset, out.nbytes = shm
        outputs.append(out)
    return outputs


def _infer_parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def infer_response(result: InferResult) -> pb.ModelInferResponse:
    """Every output's bytes go in `raw_output_contents` (empty for outputs written to shared memory)."""
    outputs = [pb.ModelInferResponse.InferOutputTensor(name=t.name, datatype=t.datatype, shape=t.shape)
               for t in result.outputs]
    raw = [b"" if t.data is None else bytes(t.data) for t in result.outputs]
    response = pb.ModelInferResponse(model_name=result.model_name, model_version=str(result.model_version),
                                     id=result.id, outputs=outputs, raw_output_contents=raw)
    for key, value in result.parameters.items():
        response.parameters[key].CopyFrom(_infer_parameter(value))
    return response


FINAL_PARAMETER = "triton_final_response"


def stream_response(result: InferResult, final: bool) -> pb.ModelStreamInferResponse:
    """A ModelStreamInfer response; like Triton, every one says whether it is the request's last."""
    response = infer_response(result)
    response.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=response)


def stream_error(request: Any, e: Any, final: bool = True) -> pb.ModelStreamInferResponse:
    """A failed request on a stream: `error_message`, and the request's id, model and version."""
    response = pb.ModelInferResponse(id=request.id, model_name=request.model_name,
                                     model_version=request.model_version)
    response.parameters[FINAL_PARAMETER].bool_param = final
    return pb.ModelStreamInferResponse(error_message=e.message, infer_response=response)


def stream_empty_final(request: Any) -> pb.ModelStreamInferResponse:
    """The bare end of a decoupled request, sent only on `triton_enable_empty_final_response`."""
    response = pb.ModelInferResponse(id=request.id, model_name=request.model_name,
                                     model_version=request.model_version)
    response.parameters[FINAL_PARAMETER].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=response)


# ---------------------------------------------------------------- everything else

def model_metadata(doc: dict[str, Any]) -> pb.ModelMetadataResponse:
    def tensors(items: list[dict]) -> list:
        return [pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                for t in items]
    return pb.ModelMetadataResponse(name=doc["name"], versions=doc["versions"], platform=doc["platform"],
                                    inputs=tensors(doc["inputs"]), outputs=tensors(doc["outputs"]))


def model_statistics(reply: R.StatsReply) -> pb.ModelStatisticsResponse:
    """The statistics Structs have the proto's field names and shapes."""
    return json_format.ParseDict({"model_stats": msgspec.to_builtins(reply.model_stats)},
                                 pb.ModelStatisticsResponse())


def repository_index(reply: R.IndexReply) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(models=[
        pb.RepositoryIndexResponse.ModelIndex(name=e.name, version=e.version, state=e.state, reason=e.reason)
        for e in reply.models])


def shm_status(reply: R.ShmStatusReply) -> pb.SystemSharedMemoryStatusResponse:
    out = pb.SystemSharedMemoryStatusResponse()
    for r in reply.regions:
        out.regions[r.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
            name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
    return out


def cuda_status(reply: R.CudaStatusReply) -> pb.CudaSharedMemoryStatusResponse:
    out = pb.CudaSharedMemoryStatusResponse()
    for r in reply.regions:
        out.regions[r.name].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(
            name=r.name, device_id=r.device_id, byte_size=r.byte_size))
    return out


def load_model(request: Any) -> tuple[S.LoadModel, dict[str, bytes]]:
    """The broker's load operation and the `file:` overrides: `config` must be a string_param,
    `file:` a bytes_param."""
    op = S.LoadModel(request.model_name)
    files = {}
    for key, p in request.parameters.items():
        kind = p.WhichOneof("parameter_choice")
        if key == "config":
            if kind != "string_param":
                raise invalid(f"invalid value type for load parameter '{key}', expected string_param.")
            op.config = p.string_param
        elif key.startswith("file:"):
            if kind != "bytes_param":
                raise invalid(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[key] = p.bytes_param
        else:
            raise invalid(f"unrecognized load parameter '{key}'.")
    return op, files


def unload_dependents(request: Any) -> bool:
    if "unload_dependents" not in request.parameters:
        return False
    p = request.parameters["unload_dependents"]
    if p.WhichOneof("parameter_choice") != "bool_param":
        raise invalid("invalid value type for 'unload_dependents' parameter, expected bool_param.")
    return p.bool_param


LOG_KINDS = {"log_file": "string_param", "log_info": "bool_param", "log_warning": "bool_param",
             "log_error": "bool_param", "log_verbose_level": "uint32_param", "log_format": "string_param"}
LOG_KIND_WORD = {"string_param": "string", "bool_param": "boolean", "uint32_param": "int32"}


def log_updates(request: Any) -> dict[str, Any]:
    updates = {}
    for key, p in request.settings.items():
        kind = LOG_KINDS.get(key)
        if kind is None:
            continue
        if p.WhichOneof("parameter_choice") != kind:
            raise invalid(f"expect {LOG_KIND_WORD[kind]} for '{key}'")
        value = getattr(p, kind)
        if key == "log_format" and value not in ("default", "ISO8601"):
            raise invalid(f"invalid argument for log_format, got: {value}")
        updates[key] = value
    return updates


def log_settings(reply: R.LogSettingsReply) -> pb.LogSettingsResponse:
    s = reply.settings
    out = pb.LogSettingsResponse()
    out.settings["log_file"].string_param = s.log_file
    out.settings["log_info"].bool_param = s.log_info
    out.settings["log_warning"].bool_param = s.log_warning
    out.settings["log_error"].bool_param = s.log_error
    out.settings["log_verbose_level"].uint32_param = s.log_verbose_level
    out.settings["log_format"].string_param = s.log_format
    return out


def trace_updates(request: Any) -> dict[str, Any]:
    """Trace settings as the broker takes them: a list for trace_level, one string otherwise,
    None (an empty value list) to clear a model-level setting."""
    updates: dict[str, Any] = {}
    for key, p in request.settings.items():
        values = list(p.value)
        if not values:
            updates[key] = None
        elif key == "trace_level":
            updates[key] = values
        elif len(values) == 1:
            updates[key] = values[0]
        else:
            raise invalid(f"expect only 1 value for '{key}'")
    return updates


def trace_settings(reply: R.TraceSettingsReply) -> pb.TraceSettingResponse:
    out = pb.TraceSettingResponse()
    for key, value in reply.settings.items():
        out.settings[key].value.extend(value if isinstance(value, list) else [value])
    return out
