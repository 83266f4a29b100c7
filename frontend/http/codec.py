"""KServe v2 JSON + Triton's binary tensor extension: request parsing, response building."""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from tritond.repository.datatypes import ELEMENT_SIZE, WIRE_TO_NUMPY, WIRE_TYPES, array_to_bytes, serialize_bytes

from ..dataplane import InferResult, InputTensor, OutputRequest
from ..errors import invalid

MAX_JSON_DEPTH = 100


def _depth(data: Any) -> int:
    d = 0
    while isinstance(data, list):
        d += 1
        if d > MAX_JSON_DEPTH:
            return d
        data = data[0] if data else None
    return d


def _flatten(data: Any, out: list) -> None:
    if isinstance(data, list):
        for x in data:
            _flatten(x, out)
    else:
        out.append(data)


def parse_json(buf: bytes | memoryview) -> dict:
    try:
        doc = orjson.loads(buf)
    except orjson.JSONDecodeError as e:
        if "recursion" in str(e).lower():
            raise invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})") from None
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("failed to parse the request JSON buffer: the request must be a JSON object")
    return doc


def _uint_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise invalid(f"Unable to parse '{what}'")
    return value


def _json_data(name: str, datatype: str, shape: list[int], data: Any, max_bytes: int) -> bytes | memoryview:
    if _depth(data) > MAX_JSON_DEPTH:
        raise invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")
    if datatype in ("FP16", "BF16"):
        raise invalid(f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}")
    flat: list = []
    _flatten(data, flat)
    count = 1
    for d in shape:
        count *= d
    if len(flat) != count:
        raise invalid(f"Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        items = []
        for x in flat:
            if not isinstance(x, str):
                raise invalid(f"Unable to parse 'data': expected string for BYTES input '{name}'")
            items.append(x.encode("utf-8"))
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return serialize_bytes(arr)
    if count * ELEMENT_SIZE[datatype] > max_bytes:
        raise invalid(f"Input '{name}' has a byte size of {count * ELEMENT_SIZE[datatype]} which exceeds the maximum "
                      f"allowed value of {max_bytes} bytes. Use --http-max-input-size to increase the limit.")
    try:
        if datatype == "BOOL":
            if not all(isinstance(x, bool) for x in flat):
                raise TypeError
            arr = np.array(flat, dtype=np.bool_)
        else:
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat):
                raise TypeError
            arr = np.array(flat, dtype=WIRE_TO_NUMPY[datatype])
    except (TypeError, ValueError, OverflowError):
        raise invalid(f"Unable to parse 'data': expected {datatype} values for input '{name}'") from None
    return array_to_bytes(arr, datatype)


def parse_infer(body: bytes, header_len: int | None, model: str, model_inputs: list[dict], max_bytes: int
                ) -> tuple[dict, list[InputTensor], list[OutputRequest], bool]:
    """Returns (json doc, inputs, requested outputs, default binary-output flag)."""
    if header_len == 0:
        return _parse_raw(body, model_inputs)
    json_part = body if header_len is None else memoryview(body)[:header_len]
    binary = memoryview(body)[header_len:] if header_len is not None else memoryview(b"")
    doc = parse_json(json_part)
    inputs: list[InputTensor] = []
    pos = 0
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise invalid("Unable to parse 'inputs'")
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise invalid("Unable to parse 'name'")
        name = item["name"]
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise invalid("Unable to parse 'datatype'")
        if datatype not in WIRE_TYPES:
            raise invalid(f"invalid datatype '{datatype}' for input '{name}'")
        shape = _uint_list(item.get("shape"), "shape")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("Unable to parse 'parameters'")
        has_data = "data" in item
        has_bin = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        if has_data + has_bin + has_shm != 1:
            names = [f"'{k}'" for k, v in (("data", has_data), ("binary_data_size", has_bin),
                                            ("shared_memory_region", has_shm)) if v]
            got = "no field is set" if not names else "set " + " ".join(names)
            raise invalid("Input must set only one of the following fields: 'data', 'binary_data_size' in "
                          "'parameters', 'shared_memory_region' in 'parameters'. But " + got)
        t = InputTensor(name, datatype, shape)
        if has_data:
            t.data = _json_data(name, datatype, shape, item["data"], max_bytes)
        elif has_bin:
            size = params["binary_data_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise invalid("Unable to parse 'binary_data_size'")
            if header_len is None:
                raise invalid("must specify valid 'Infer-Header-Content-Length' in request header and "
                              "'binary_data_size' when passing inputs in binary data format")
            if pos + size > len(binary):
                raise invalid(f"unexpected size for input '{name}', expecting {size} additional bytes for model "
                              f"'{model}'")
            t.data = binary[pos:pos + size]
            pos += size
        else:
            t.region = params["shared_memory_region"]
            t.offset = params.get("shared_memory_offset", 0)
            t.nbytes = params.get("shared_memory_byte_size")
            if not isinstance(t.region, str) or not isinstance(t.offset, int) or not isinstance(t.nbytes, int) \
                    or isinstance(t.nbytes, bool) or t.offset < 0 or t.nbytes < 0:
                raise invalid(f"Unable to parse shared memory parameters for input '{name}'")
        inputs.append(t)
    if pos != len(binary):
        raise invalid(f"unexpected additional input data for model '{model}'")
    req_params = doc.get("parameters") or {}
    if not isinstance(req_params, dict):
        raise invalid("Unable to parse 'parameters'")
    default_binary = bool(req_params.get("binary_data_output", False))
    outputs: list[OutputRequest] = []
    raw_outputs = doc.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise invalid("Unable to parse 'outputs'")
    for item in raw_outputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise invalid("Unable to parse 'name'")
        params = item.get("parameters") or {}
        o = OutputRequest(item["name"])
        if "shared_memory_region" in params:
            if "classification" in params:
                raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
            if params.get("binary_data") is True:
                raise invalid("Output can't set both 'shared_memory_region' and 'binary_data'")
            o.region = params["shared_memory_region"]
            o.offset = params.get("shared_memory_offset", 0)
            o.nbytes = params.get("shared_memory_byte_size", 0)
            if not isinstance(o.region, str) or not isinstance(o.offset, int) or not isinstance(o.nbytes, int):
                raise invalid(f"Unable to parse shared memory parameters for output '{o.name}'")
        if "classification" in params:
            c = params["classification"]
            if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c > (1 << 20):
                raise invalid(f"Unable to parse 'classification' for output '{o.name}'")
            o.classification = c
        if "binary_data" in params:
            if not isinstance(params["binary_data"], bool):
                raise invalid("Unable to parse 'binary_data'")
            o.binary = params["binary_data"]
        outputs.append(o)
    return doc, inputs, outputs, default_binary


def _parse_raw(body: bytes, model_inputs: list[dict]) -> tuple[dict, list[InputTensor], list[OutputRequest], bool]:
    """Inference-Header-Content-Length: 0 — the whole body is the single input's data."""
    if len(model_inputs) != 1:
        raise invalid("Raw binary request body is only supported for models with a single input")
    from tritond.repository.datatypes import CONFIG_TO_WIRE
    ci = model_inputs[0]
    datatype = CONFIG_TO_WIRE.get(ci.get("data_type", ""), "")
    dims = [int(d) for d in ci.get("dims", [])]
    if datatype == "BYTES":
        shape = [1]
    else:
        size = ELEMENT_SIZE[datatype]
        known = 1
        for d in dims:
            if d != -1:
                known *= d
        if sum(1 for d in dims if d == -1) > 1 or known == 0 or len(body) % (known * size):
            raise invalid("Raw binary request requires at most one variable dimension matching the body size")
        shape = [len(body) // (known * size) if d == -1 else d for d in dims]
    return {}, [InputTensor(ci["name"], datatype, shape, body)], [], True


def render_response(result: InferResult, default_binary: bool) -> tuple[bytes, int | None]:
    """(body, json length or None when the response is JSON only)."""
    outputs = []
    blobs: list[bytes | memoryview] = []
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
            arr = t.as_numpy()
            if t.datatype == "BYTES":
                entry["data"] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                                 for x in arr.reshape(-1)]
            elif t.datatype in ("FP16", "BF16"):
                entry["data"] = arr.astype(np.float32).reshape(-1).tolist() if t.datatype == "FP16" \
                    else arr.reshape(-1).tolist()
            else:
                entry["data"] = arr.reshape(-1).tolist()
        outputs.append(entry)
    doc: dict[str, Any] = {}
    if result.id:
        doc["id"] = result.id
    doc["model_name"] = result.model_name
    doc["model_version"] = str(result.model_version)
    if result.parameters:
        doc["parameters"] = result.parameters
    doc["outputs"] = outputs
    head = orjson.dumps(doc)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)
