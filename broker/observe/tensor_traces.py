"""Triton's TENSORS trace level: a traced request's input tensors as they enter its model's queue
(TENSOR_QUEUE_INPUT) and the output tensors of each of its responses, an ensemble's included
(TENSOR_BACKEND_OUTPUT),
written beside the trace's timestamps in Triton's layout and value formatting.

The broker reads the tensors where the request and the reply leave them: inline, or in the
shared memory of an arena or a client region, mapped for the read only (a trace holds no
mapping open); one in device memory is traced without its data, as are FP16 and BF16 tensors
(Triton leaves those out too).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tritond.repository.datatypes import WIRE_TO_NUMPY, deserialize_bytes
from tritond.shm.mapping import MappingError, SegmentMaps
from tritond.shm.regions import CUDA_PREFIX
from tritond.wire.schema import Block, Inline, Region, TensorDesc

_UNFORMATTED = ("FP16", "BF16")


def tensor_record(trace_id: int, activity: str, desc: TensorDesc) -> dict[str, Any]:
    """One tensor of a trace, as Triton's trace file holds it."""
    maps = SegmentMaps()
    try:
        data = _data(desc, _bytes(desc, maps))
    finally:
        maps.close()
    return {"id": trace_id, "activity": activity,
            "tensor": {"name": desc.name, "data": data, "shape": ",".join(map(str, desc.shape)),
                       "dtype": desc.datatype}}


def _data(desc: TensorDesc, raw: memoryview | None) -> str:
    if raw is None or desc.datatype in _UNFORMATTED:
        return ""
    count = int(np.prod(desc.shape, dtype=np.int64))
    try:
        if desc.datatype == "BYTES":
            return ",".join(f'"{bytes(v).decode("utf-8", "replace")}"' for v in deserialize_bytes(raw, count))
        values = np.frombuffer(raw, WIRE_TO_NUMPY[desc.datatype], count)
    except (ValueError, KeyError):
        return ""
    if desc.datatype == "BOOL":
        return ",".join("1" if v else "0" for v in values)
    if values.dtype.kind == "f":
        return ",".join(f"{v:g}" for v in values)
    return ",".join(str(v) for v in values.tolist())


def _bytes(desc: TensorDesc, maps: SegmentMaps) -> memoryview | None:
    loc = desc.loc
    if isinstance(loc, Inline):
        return memoryview(loc.data)
    key = loc.key if isinstance(loc, Region) else loc.seg if isinstance(loc, Block) else ""
    if not key or key.startswith(CUDA_PREFIX):
        return None
    try:
        return maps.view(key, loc.offset, loc.nbytes)
    except (MappingError, OSError, ValueError):
        return None
