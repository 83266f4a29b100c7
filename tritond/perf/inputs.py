"""Request data as perf_analyzer makes it: from the model's metadata and config, `-b`,
`--shape NAME:d1,d2` for variable dimensions, and `--input-data zero|random|FILE` where FILE
is perf_analyzer's JSON format (`{"data": [{"INPUT0": [...]}, ...]}`, with optional
`{"content": ..., "shape": [...]}` and `{"b64": ...}` forms). Each data entry describes one
batch-1 request; `-b N` repeats it N times along the batch dimension. Requests cycle through
the entries in order.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .loadgen import NUMPY_DTYPES, Input


class InputDataError(ValueError):
    """The options or the data file do not fit the model's inputs; the message says how."""


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """`NAME:d1,d2,...` options (the non-batch dimensions) -> {NAME: [d1, d2, ...]}."""
    out: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",") if d.strip()] if sep else None
        except ValueError:
            shape = None
        if not name or shape is None or any(d < 0 for d in shape):
            raise InputDataError(f"--shape {item!r}: expected NAME:d1,d2,... with non-negative sizes")
        out[name] = shape
    return out


def _dims(tensor: dict, batching: bool, shapes: dict[str, list[int]]) -> list[int]:
    """The non-batch dimensions of one input, variable ones taken from --shape."""
    dims = [int(d) for d in tensor["shape"]][1 if batching else 0:]
    given = shapes.get(tensor["name"])
    if given is not None:
        if len(given) != len(dims) or any(d >= 0 and d != g for d, g in zip(dims, given)):
            raise InputDataError(f"--shape {tensor['name']}:{','.join(map(str, given))} does not match the "
                                 f"model's dims {dims}")
        return list(given)
    if any(d < 0 for d in dims):
        raise InputDataError(f"input {tensor['name']} has variable dims {dims}: give its shape with "
                             f"--shape {tensor['name']}:{','.join('1' if d < 0 else str(d) for d in dims)}")
    return dims


def _generated(datatype: str, dims: list[int], mode: str, rng: np.random.Generator,
               string_data: str | None, string_length: int) -> np.ndarray:
    size = int(np.prod(dims)) if dims else 1
    if datatype == "BYTES":
        if string_data is not None:
            items = [string_data.encode()] * size
        else:
            letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
            items = [rng.choice(letters, string_length).tobytes() for _ in range(size)]
        return np.array(items, dtype=np.object_).reshape(dims)
    dtype = np.dtype(NUMPY_DTYPES[datatype])
    if mode == "zero":
        return np.zeros(dims, dtype)
    if datatype == "BOOL":
        return rng.integers(0, 2, size).astype(dtype).reshape(dims)
    if datatype.startswith(("INT", "UINT")):
        return rng.integers(0, 100, size).astype(dtype).reshape(dims)
    return rng.random(size).astype(dtype).reshape(dims)


def _from_b64(text: str, datatype: str, dims: list[int] | None, name: str) -> np.ndarray:
    raw = base64.b64decode(text)
    if datatype == "BYTES":
        items, pos = [], 0
        while pos < len(raw):
            n = int.from_bytes(raw[pos:pos + 4], "little")
            items.append(raw[pos + 4:pos + 4 + n])
            pos += 4 + n
        arr = np.array(items, dtype=np.object_)
    else:
        dtype = np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")
        if len(raw) % dtype.itemsize:
            raise InputDataError(f"input {name}: b64 data is {len(raw)} bytes, not a whole number of {datatype}")
        arr = np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="))
    return arr if dims is None else _reshaped(arr, dims, name)


def _reshaped(arr: np.ndarray, dims: list[int], name: str) -> np.ndarray:
    if arr.size != int(np.prod(dims)):
        raise InputDataError(f"input {name}: {arr.size} elements given, shape {dims} needs {int(np.prod(dims))}")
    return arr.reshape(dims)


def _from_json(value, datatype: str, dims: list[int] | None, name: str) -> np.ndarray:
    """One tensor of a data entry: a flat list, {"b64": ...}, or {"content": ..., "shape": [...]}."""
    if isinstance(value, dict) and "content" in value:
        shape = value.get("shape")
        return _from_json(value["content"], datatype, [int(d) for d in shape] if shape else dims, name)
    if isinstance(value, dict) and "b64" in value:
        return _from_b64(value["b64"], datatype, dims, name)
    if not isinstance(value, list):
        raise InputDataError(f"input {name}: expected a list, {{\"b64\": ...}} or {{\"content\": ...}}")
    if datatype == "BYTES":
        arr = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in np.ravel(value)], dtype=np.object_)
    else:
        arr = np.asarray(value, dtype=NUMPY_DTYPES[datatype]).ravel()
    if dims is None or any(d < 0 for d in dims):
        raise InputDataError(f"input {name} has variable dims: give \"shape\" in the data file or --shape")
    return _reshaped(arr, dims, name)


def _load_json(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputDataError(f"--input-data {path}: {e}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputDataError(f"--input-data {path}: expected {{\"data\": [ {{...}}, ... ]}} with at least one entry")
    if any(isinstance(e, list) for e in entries):
        raise InputDataError(f"--input-data {path}: data streams (lists of entries, for sequence models) are not supported")
    return entries


def request_data(metadata: dict, max_batch_size: int, batch_size: int, shapes: dict[str, list[int]],
                 input_data: str = "random", string_data: str | None = None,
                 string_length: int = 128) -> list[list[Input]]:
    """The inputs of each distinct request, in the order requests cycle through them."""
    batching = max_batch_size > 0
    if batch_size < 1:
        raise InputDataError("-b: the batch size must be at least 1")
    if not batching and batch_size > 1:
        raise InputDataError(f"-b {batch_size}: the model does not support batching (max_batch_size 0)")
    if batching and batch_size > max_batch_size:
        raise InputDataError(f"-b {batch_size}: exceeds the model's max_batch_size {max_batch_size}")
    tensors = metadata.get("inputs", [])
    unknown = set(shapes) - {t["name"] for t in tensors}
    if unknown:
        raise InputDataError(f"--shape names unknown inputs: {', '.join(sorted(unknown))}")
    rng = np.random.default_rng(0)
    if input_data in ("zero", "random"):
        entries: list[dict] = [{}]
    else:
        entries = _load_json(Path(input_data))
    out = []
    for entry in entries:
        inputs = []
        for t in tensors:
            name, datatype = t["name"], t["datatype"]
            if datatype not in NUMPY_DTYPES:
                raise InputDataError(f"input {name}: datatype {datatype} is not supported")
            if entry:
                if name not in entry:
                    raise InputDataError(f"--input-data {input_data}: an entry has no data for input {name}")
                try:
                    dims = _dims(t, batching, shapes)
                except InputDataError:
                    dims = None   # the entry's own "shape" may fill it
                one = _from_json(entry[name], datatype, dims, name)
            else:
                one = _generated(datatype, _dims(t, batching, shapes), input_data, rng, string_data, string_length)
            data = np.stack([one] * batch_size) if batching else one
            inputs.append(Input(name, datatype, data))
        out.append(inputs)
    return out
