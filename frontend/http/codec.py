"""KServe v2 JSON + Triton's binary tensor extension: request parsing, response building."""
from __future__ import annotations

import re
import secrets
from typing import Any

import msgspec
import numpy as np
import orjson

from tritond.repository.datatypes import (ELEMENT_SIZE, WIRE_TO_NUMPY, WIRE_TYPES, array_to_bytes, element_count,
                                          serialize_bytes)
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid, request_prefix as prefix, unsupported
from tritond.wire.schema import INLINE_MAX, ModelView

from ..dataplane import (FLAG_END, FLAG_START, MAX_STRING_CORRID, RESERVED_PREFIX, InferResult, InputTensor,
                         OutputRequest, OutputTensor, RequestOptions)

MAX_JSON_DEPTH = 100
INT64_MAX = (1 << 63) - 1


def _nesting_error() -> Exception:
    return invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")


def _flatten(data: list) -> list:
    """Row-major leaves of a nested JSON array, refusing nesting deeper than Triton allows."""
    out: list = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                if len(stack) >= MAX_JSON_DEPTH:
                    raise _nesting_error()
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def parse_json(buf: bytes | memoryview) -> dict:
    try:
        doc = orjson.loads(buf)
    except orjson.JSONDecodeError as e:
        text = str(e).lower()
        if "recursion" in text or "depth" in text:
            raise _nesting_error() from None
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("failed to parse the request JSON buffer: the request must be a JSON object")
    return doc


class _JsonInput(msgspec.Struct):
    """An input of a JSON request; its `data` stays unparsed text until the declared shape
    and datatype say how large it may be (so an oversized tensor is refused before its
    values become Python objects, about 30 bytes each)."""
    name: Any = msgspec.UNSET
    datatype: Any = msgspec.UNSET
    shape: Any = msgspec.UNSET
    parameters: Any = msgspec.UNSET
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _JsonRequest(msgspec.Struct):
    id: Any = msgspec.UNSET
    parameters: Any = msgspec.UNSET
    outputs: Any = msgspec.UNSET
    inputs: list[_JsonInput] | msgspec.UnsetType = msgspec.UNSET


_decode_request = msgspec.json.Decoder(_JsonRequest).decode


def _parse_request(buf: bytes | memoryview) -> _JsonRequest:
    """The request's members (inputs as structs, data unparsed), with parse_json's errors."""
    try:
        req = _decode_request(buf)
    except RecursionError:
        raise _nesting_error() from None
    except msgspec.ValidationError as e:
        if "$.inputs" in str(e):
            raise invalid("Unable to parse 'inputs'") from None
        raise invalid("failed to parse the request JSON buffer: the request must be a JSON object") from None
    except msgspec.DecodeError as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if req.inputs is msgspec.UNSET:
        raise invalid("Unable to parse 'inputs'")
    return req


_WHOLE = 1 << 20     # a data text up to this size is counted in one piece


def _count(buf: bytes | memoryview, needle: bytes, step: int = _WHOLE) -> int:
    """Occurrences of `needle` in `buf`, a slice at a time (no copy of the whole buffer)."""
    if isinstance(buf, bytes):
        return buf.count(needle)
    overlap = len(needle) - 1
    return sum(buf[max(0, i - overlap):i + step].tobytes().count(needle) for i in range(0, len(buf), step))


def _estimated_elements(text: bytes | memoryview, datatype: str) -> int:
    """How many values a JSON array's text holds at least: one more than its commas (a nested
    array has as many separators as values less one), or for strings half their unescaped
    quotes. Never more than it holds, so refusing above the declared count is always right."""
    if datatype == "BYTES":
        return (_count(text, b'"') - _count(text, b'\\"')) // 2
    return _count(text, b",") + 1


def _shape(value: Any) -> list[int]:
    """A JSON input's shape: uint64 values, as Triton parses them (its error for a negative or
    non-integer dimension is an INTERNAL one, HTTP 500, which its qa tests pin)."""
    if not isinstance(value, list):
        raise invalid("Unable to parse 'shape'")
    for x in value:
        if type(x) is not int or not 0 <= x < (1 << 64):     # JSON gives exact ints; bool is not one
            raise TritonError(Code.INTERNAL, "Unable to parse 'shape': attempt to access JSON "
                                             "non-unsigned-integer as unsigned-integer")
    return value


_BOOL = frozenset((bool,))
_NUMBER = frozenset((int, float))
_INT = frozenset((int,))


def _too_big(name: str, size: int, max_bytes: int) -> Exception:
    return invalid(f"JSON input '{name}' has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
                   f"{max_bytes} bytes. Use --http-max-input-size to increase the limit.")


def _shape_text(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _json_data(name: str, datatype: str, shape: list[int], raw: msgspec.Raw, max_bytes: int) -> bytes | memoryview:
    """The wire bytes of a JSON `data` field (Triton's checks and messages, but 400 rather than 500).
    The declared size is checked before the values are parsed."""
    count = 1
    for d in shape:
        count *= d
    if shape and max(shape) > INT64_MAX:
        raise invalid(f"invalid shape for input '{name}': shape {_shape_text(shape)} contains one or more invalid "
                      f"dimensions")
    if count > INT64_MAX:
        raise invalid(f"invalid shape for input '{name}': shape {_shape_text(shape)} causes total element count to "
                      f"exceed maximum size of {INT64_MAX}")
    if count == 0:
        return b""
    size = ELEMENT_SIZE[datatype]
    if datatype != "BYTES" and size > 1 and count > INT64_MAX // size:
        raise invalid(f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) "
                      f"exceeds maximum allowed size ({INT64_MAX})")
    if datatype in ("FP16", "BF16"):
        raise invalid(f"receiving {datatype} data via JSON is not supported. Please use the binary data format "
                      f"for input {name}")
    least = 4 * count if datatype == "BYTES" else count * size
    if least > max_bytes:
        raise _too_big(name, least, max_bytes)
    text = memoryview(raw)
    if len(text) <= _WHOLE:
        text = text.tobytes()       # small: one copy serves the estimate and the parse
    if _estimated_elements(text, datatype) > count:
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        if "recursion" in str(e).lower():
            raise _nesting_error() from None
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(data, list):
        raise invalid("Unable to parse 'data': attempt to access JSON non-array as array")
    types = set(map(type, data))
    flat = data
    if list in types:
        flat = _flatten(data)
        types = set(map(type, flat))
    if datatype == "BYTES":
        if not types <= {str}:
            raise invalid(f"Unable to parse 'data': expected string for BYTES input '{name}'")
        items = [x.encode("utf-8") for x in flat]
        size = sum(len(x) + 4 for x in items)
        if size > max_bytes:
            raise _too_big(name, size, max_bytes)
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return serialize_bytes(arr)
    if len(flat) > count:
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if len(flat) < count:
        raise invalid("Failed to parse 'data' field: shape does not match true shape")
    if not types <= (_BOOL if datatype == "BOOL" else _NUMBER if datatype.startswith("FP") else _INT):
        raise invalid(f"Unable to parse 'data': expected {datatype} values for input '{name}'")
    try:
        arr = np.array(flat, dtype=WIRE_TO_NUMPY[datatype])
    except (TypeError, ValueError, OverflowError):
        raise invalid(f"Unable to parse 'data': expected {datatype} values for input '{name}'") from None
    if arr.nbytes <= INLINE_MAX:
        return arr.tobytes()        # the bytes the request carries inline, as they are
    return array_to_bytes(arr, datatype)


def parse_infer(body: bytes | memoryview, header_len: int | None, model: str, view: ModelView | None,
                max_bytes: int, origin: tuple[str, int] | None = None
                ) -> tuple[RequestOptions, list[InputTensor], list[OutputRequest], bool]:
    """The finished request: (options, inputs, requested outputs, default binary-output flag),
    each member checked once, in Triton's order and with its messages. `origin` (segment,
    offset) says where in this frontend's arena the body lies, so binary inputs keep their place."""
    if header_len == 0:
        return _parse_raw(body, model, view or ModelView(), origin)
    json_part = body if header_len is None else memoryview(body)[:header_len]
    binary = memoryview(body)[header_len:] if header_len is not None else memoryview(b"")
    req = _parse_request(json_part)
    inputs: list[InputTensor] = []
    pos = 0
    for item in req.inputs:
        params = _parameter_map(item.parameters)
        has_data = item.data is not msgspec.UNSET
        has_bin = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        if has_data + has_bin + has_shm != 1:
            names = [f"'{k}'" for k, v in (("data", has_data), ("binary_data_size", has_bin),
                                            ("shared_memory_region", has_shm)) if v]
            got = "no field is set" if not names else "set " + " ".join(names)
            raise invalid("Input must set only one of the following fields: 'data', 'binary_data_size' in "
                          "'parameters', 'shared_memory_region' in 'parameters'. But " + got)
        name = item.name
        if not isinstance(name, str):
            raise invalid("Unable to parse 'name'")
        datatype = item.datatype
        if not isinstance(datatype, str):
            raise invalid("Unable to parse 'datatype'")
        if datatype not in WIRE_TYPES:
            raise invalid(f"invalid datatype '{datatype}' for input '{name}'")
        shape = _shape(item.shape)
        t = InputTensor(name, datatype, shape)
        if has_data:
            t.data = _json_data(name, datatype, shape, item.data, max_bytes)
        elif has_bin:
            size = _uint(params["binary_data_size"], "binary_data_size")
            if header_len is None and size:
                raise invalid("must specify valid 'Infer-Header-Content-Length' in request header and "
                              "'binary_data_size' when passing inputs in binary data format")
            if pos + size > len(binary):
                raise invalid(f"unexpected size for input '{name}', expecting {pos + size - len(binary)} "
                              f"additional bytes for model '{model}'")
            t.data = binary[pos:pos + size]
            if origin is not None:
                t.at = S.Block(origin[0], origin[1] + header_len + pos, size)
            pos += size
        else:
            t.region, t.offset, t.nbytes = _shm_parameters(params)
        inputs.append(t)
    if pos != len(binary):
        raise invalid(f"unexpected additional input data for model '{model}'")
    opts, default_binary, long_correlation_id = _request_options(_parameter_map(req.parameters))
    outputs: list[OutputRequest] = []
    raw_outputs = [] if req.outputs is msgspec.UNSET else req.outputs
    if not isinstance(raw_outputs, list):
        raise invalid("Unable to parse 'outputs'")
    for item in raw_outputs:
        outputs.append(_output(item))
    if req.id is not msgspec.UNSET:
        if not isinstance(req.id, str):
            raise invalid("Unable to parse 'id'")
        opts.id = req.id
    if long_correlation_id:
        raise unsupported(f"string correlation ID cannot be longer than {MAX_STRING_CORRID} characters")
    return opts, inputs, outputs, default_binary


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << 64):
        raise invalid(f"Unable to parse '{what}'")
    return value


def _parameters(item: dict) -> dict:
    return _parameter_map(item.get("parameters"))


def _parameter_map(params: Any) -> dict:
    if params is None or params is msgspec.UNSET:
        return {}
    if not isinstance(params, dict):
        raise invalid("Unable to parse 'parameters'")
    return params


def _is_uint64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 64)


def _request_options(params: dict) -> tuple[RequestOptions, bool, bool]:
    """Request parameters checked as Triton's HTTP frontend does them, in one pass: (the request's
    options, the binary_data_output default, whether a string sequence_id is too long; Triton
    finds that only after the rest of the request parsed, so the caller raises it then)."""
    opts = RequestOptions()
    if not params:
        return opts, False, False
    binary_output = False
    long_correlation_id = False
    for key, value in params.items():
        if key == "sequence_id":
            if isinstance(value, str):
                long_correlation_id = len(value) > MAX_STRING_CORRID
            elif not _is_uint64(value):
                raise invalid("Unable to parse 'sequence_id'")
            opts.correlation_id = value
        elif key == "sequence_start" or key == "sequence_end":
            if not isinstance(value, bool):
                raise invalid(f"Unable to parse '{key}'")
            if value:
                opts.flags |= FLAG_START if key == "sequence_start" else FLAG_END
        elif key == "priority":
            if not _is_uint64(value):
                raise invalid("Unable to parse 'priority'")
            opts.priority = value
        elif key == "timeout":
            if not _is_uint64(value):
                raise invalid("Unable to parse 'timeout'")
            opts.timeout_us = value
        elif key == "binary_data_output":
            if not isinstance(value, bool):
                raise invalid("Unable to parse 'binary_data_output'")
            binary_output = value
        elif key.startswith(RESERVED_PREFIX):
            raise invalid("parameter keys starting with 'triton_' are reserved for Triton usage and should not "
                          "be specified.")
        elif isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 63):
            opts.params[key] = float(value)
        elif not isinstance(value, (str, int, float)):
            raise invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        else:
            opts.params[key] = value
    return opts, binary_output, long_correlation_id


def _output(item: Any) -> OutputRequest:
    if not isinstance(item, dict):
        raise invalid("Unable to parse 'outputs'")
    params = _parameters(item)
    if "shared_memory_region" in params:
        if "classification" in params:
            raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
        if "binary_data" in params:
            if not isinstance(params["binary_data"], bool):
                raise invalid("Unable to set 'binary_data'")
            if params["binary_data"]:
                raise invalid("Output can't set both 'shared_memory_region' and 'binary_data'")
    if not isinstance(item.get("name"), str):
        raise invalid("Unable to parse 'name'")
    o = OutputRequest(item["name"])
    if "classification" in params:
        c = params["classification"]
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < (1 << 64):
            raise invalid("Unable to set 'classification'")
        o.classification = c
    if "shared_memory_region" in params:
        o.region, o.offset, o.nbytes = _shm_parameters(params)
    else:   # a listed output is JSON unless it asks for binary; binary_data_output covers unlisted ones
        o.binary = params.get("binary_data", False)
        if not isinstance(o.binary, bool):
            raise invalid("Unable to parse 'binary_data'")
    return o


def _shm_parameters(params: dict) -> tuple[str, int, int]:
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise invalid("Unable to parse 'shared_memory_region'")
    offset = _uint(params.get("shared_memory_offset", 0), "shared_memory_offset")
    size = _uint(params.get("shared_memory_byte_size", 0), "shared_memory_byte_size")
    return region, offset, size


def _parse_raw(body: bytes | memoryview, model: str, view: ModelView, origin: tuple[str, int] | None
               ) -> tuple[RequestOptions, list[InputTensor], list[OutputRequest], bool]:
    """Inference-Header-Content-Length: 0: the whole body is the data of the model's only input."""
    pre = prefix("")
    model_inputs = list(view.inputs.values())
    if len(model_inputs) != 1:
        raise invalid(f"{pre}Raw request must only have 1 input (found 1) to be deduced but got "
                      f"{len(model_inputs)} inputs in '{model}' model configuration")
    ci = model_inputs[0]
    datatype = ci.datatype
    shape = [1] if view.max_batch_size > 0 else []
    dynamic_axis = -1
    known = 1
    for d in ci.dims:
        if d == -1:
            if dynamic_axis != -1:
                raise invalid(f"{pre}The shape of the raw input '{ci.name}' can not be deduced because there "
                              f"are more than one variable-sized dimension")
            dynamic_axis = len(shape)
        else:
            known *= d
        shape.append(d)
    data: bytes | memoryview = body
    if datatype == "BYTES":
        if dynamic_axis != -1 or known != 1:
            raise invalid(f"{pre}For BYTE datatype raw input '{ci.name}', the model must have input shape [1]")
        data = len(body).to_bytes(4, "little") + body
    elif dynamic_axis != -1:
        size = ELEMENT_SIZE.get(datatype, 0)
        shape[dynamic_axis] = len(body) // known // size if known and size else 0
    t = InputTensor(ci.name, datatype, shape, data)
    if origin is not None and data is body:
        t.at = S.Block(origin[0], origin[1], len(body))
    return RequestOptions(), [t], [], True


def _json_numbers(t: OutputTensor) -> np.ndarray:
    """A fixed-size output as a flat array orjson writes as JSON numbers without a Python object
    per value (a JSON rendering of a large output would otherwise take ~30 bytes per value);
    floats go as float64, so they print exactly as Python floats of the same values do. Bytes
    that do not hold the shape's elements are refused as a reshape would (ValueError)."""
    flat = np.frombuffer(t.data, WIRE_TO_NUMPY[t.datatype])
    if flat.size != element_count(t.shape):
        raise ValueError(f"output '{t.name}' holds {flat.size} elements, not those of shape {t.shape}")
    if t.datatype == "BF16":
        raise invalid("sending BF16 data via JSON is not supported. Please use the binary data format "
                      "for output")
    if flat.dtype.kind == "f":
        return flat.astype(np.float64)
    return flat


# JSON string escapes as Triton's JSON writer makes them; every other byte is written unchanged.
_JSON_ESCAPES = {**{i: b"\\u%04X" % i for i in range(0x20)}, 0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n",
                 0x0C: b"\\f", 0x0D: b"\\r", 0x22: b'\\"', 0x5C: b"\\\\"}
_JSON_ESCAPED = re.compile(rb'[\x00-\x1f"\\]')


def _raw_json_strings(items: list[bytes]) -> bytes:
    """A JSON array of byte strings written as Triton writes BYTES output data, without checking
    the encoding: an element that is not UTF-8 reaches the client as the model produced it (and
    a client that decodes the body as UTF-8 reports it), never silently altered."""
    escaped = (_JSON_ESCAPED.sub(lambda m: _JSON_ESCAPES[m.group()[0]], x) for x in items)
    return b"[" + b",".join(b'"' + x + b'"' for x in escaped) + b"]"


def response_parts(result: InferResult, default_binary: bool) -> tuple[bytes, list[bytes | memoryview]]:
    """(the JSON part, the binary outputs that follow it, as the outputs hold them)."""
    outputs = []
    blobs: list[bytes | memoryview] = []
    raw: dict[bytes, bytes] = {}        # BYTES data that is not UTF-8, spliced in after orjson
    for t in result.outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if t.data is None:
            outputs.append(entry)
            continue
        binary = default_binary if t.binary is None else t.binary
        if binary:
            entry["parameters"] = {"binary_data_size": len(t.data)}
            blobs.append(t.data)
        else:
            if t.datatype == "BYTES":
                items = [x if isinstance(x, bytes) else str(x).encode() for x in t.as_numpy().reshape(-1)]
                try:
                    entry["data"] = [x.decode("utf-8") for x in items]
                except UnicodeDecodeError:
                    marker = f"tritond-raw-{secrets.token_hex(16)}"
                    raw[orjson.dumps(marker)] = _raw_json_strings(items)
                    entry["data"] = marker
            else:
                entry["data"] = _json_numbers(t)
        outputs.append(entry)
    doc: dict[str, Any] = {}
    if result.id:
        doc["id"] = result.id
    doc["model_name"] = result.model_name
    doc["model_version"] = str(result.model_version)
    if result.parameters:
        doc["parameters"] = result.parameters
    doc["outputs"] = outputs
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    for marker, data in raw.items():
        head = head.replace(marker, data, 1)
    return head, blobs
