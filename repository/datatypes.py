"""Triton datatype names, their config spellings, numpy types and the BYTES wire format.

Shared by every process: the frontend validates with it, workers build arrays with it.
"""
from __future__ import annotations

import struct

import numpy as np

# Wire datatype -> numpy dtype (BYTES and BF16 have no plain numpy equivalent).
WIRE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
    "BF16": np.dtype(np.uint16),
}

WIRE_TYPES = tuple(WIRE_TO_NUMPY)

# Element size in bytes; BYTES is variable (0 here).
ELEMENT_SIZE: dict[str, int] = {k: (0 if k == "BYTES" else v.itemsize) for k, v in WIRE_TO_NUMPY.items()}

# config.pbtxt TYPE_* names <-> wire names.
CONFIG_TO_WIRE: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
WIRE_TO_CONFIG: dict[str, str] = {v: k for k, v in CONFIG_TO_WIRE.items()}

_NUMPY_TO_WIRE: dict[np.dtype, str] = {
    v: k for k, v in WIRE_TO_NUMPY.items() if k not in ("BF16",)
}


def numpy_to_wire(dtype: np.dtype) -> str:
    """Wire datatype for a numpy dtype; str/bytes arrays map to BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    try:
        return _NUMPY_TO_WIRE[dtype]
    except KeyError:
        raise ValueError(f"unsupported numpy dtype {dtype}") from None


MAX_ELEMENTS = 1 << 62


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    """Product of dims; raises ValueError on negative dims or overflow past 2^62."""
    n = 1
    for d in shape:
        if d < 0:
            raise ValueError("negative dimension")
        n *= d
        if n > MAX_ELEMENTS:
            raise ValueError("element count overflow")
    return n


def byte_size(datatype: str, shape: list[int] | tuple[int, ...]) -> int:
    """Bytes a fixed-size tensor occupies (BYTES: -1, since only the payload knows)."""
    size = ELEMENT_SIZE[datatype]
    if size == 0:
        return -1
    return element_count(shape) * size


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES encoding: per element a little-endian uint32 length, then the bytes."""
    parts = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        b = bytes(item)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(buf: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Inverse of serialize_bytes; raises ValueError on a truncated buffer or count mismatch."""
    mv = memoryview(buf)
    items = []
    pos = 0
    end = len(mv)
    while pos < end:
        if pos + 4 > end:
            raise ValueError("incomplete string length indicator")
        (n,) = struct.unpack_from("<I", mv, pos)
        pos += 4
        if pos + n > end:
            raise ValueError("incomplete string data")
        items.append(bytes(mv[pos:pos + n]))
        pos += n
    if count is not None and len(items) != count:
        raise ValueError(f"unexpected number of string elements {len(items)}, expecting {count}")
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def array_to_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Raw little-endian payload of an array in the wire layout of `datatype`."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    arr = np.ascontiguousarray(array, dtype=WIRE_TO_NUMPY[datatype])
    return memoryview(arr.reshape(-1)).cast("B")     # flat: a view with a 0 in its shape cannot be cast


def bytes_to_array(buf: bytes | memoryview, datatype: str, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """Zero-copy numpy view (fixed-size types) or decoded object array (BYTES)."""
    if datatype == "BYTES":
        return deserialize_bytes(buf, element_count(shape)).reshape(shape)
    return np.frombuffer(buf, dtype=WIRE_TO_NUMPY[datatype]).reshape(shape)
