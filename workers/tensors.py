"""Tensor descriptors <-> numpy arrays inside a worker.

Inputs become views on shared memory (no copy), including a client's system region; an
input in a CUDA region is copied to the host once. Outputs are written once, either into a
client's region (system or CUDA), inline (small), or into one arena block shared by the
whole batch.
"""
from __future__ import annotations

import numpy as np

from tritond.broker.protocol import INLINE_MAX, Err, ExecResult, OutputSpec, TensorDesc
from tritond.repository.datatypes import array_to_bytes, bytes_to_array, numpy_to_wire
from tritond.shm.arena import ALIGN, Arena
from tritond.shm.mapping import SegmentMaps
from tritond.shm.regions import CUDA_PREFIX


def desc_to_array(desc: TensorDesc, maps: SegmentMaps) -> np.ndarray:
    if desc.data is not None:
        return bytes_to_array(desc.data, desc.datatype, desc.shape)
    if desc.seg.startswith(CUDA_PREFIX):
        return bytes_to_array(maps.cuda.read(desc.seg, desc.offset, desc.nbytes), desc.datatype, desc.shape)
    return bytes_to_array(maps.view(desc.seg, desc.offset, desc.nbytes), desc.datatype, desc.shape)


def _write_region(maps: SegmentMaps, spec: OutputSpec, payload: memoryview | bytes, size: int) -> None:
    if spec.seg.startswith(CUDA_PREFIX):
        maps.cuda.write(spec.seg, spec.offset, payload)
        return
    dst = maps.view(spec.seg, spec.offset, size)
    if not _same_memory(dst, payload):
        dst[:] = payload


def _same_memory(dst: memoryview, payload: memoryview | bytes) -> bool:
    """True when the output already sits where it must go (a model that returns its input,
    with input and output registered over the same bytes): the copy would be a no-op."""
    if isinstance(payload, bytes) or len(payload) != len(dst) or not len(dst):
        return False
    a = np.frombuffer(dst, dtype=np.uint8)
    b = np.frombuffer(payload, dtype=np.uint8)
    return a.ctypes.data == b.ctypes.data


class Leases:
    """Output blocks handed to consumers; a block is freed when every holder released it."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.blocks: dict[int, list] = {}   # lease -> [seg, offset, holders]
        self.next = 0

    def add(self, seg: str, offset: int, holders: int) -> int:
        self.next += 1
        self.blocks[self.next] = [seg, offset, holders]
        return self.next

    def release(self, lease: int) -> None:
        entry = self.blocks.get(lease)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] <= 0:
            del self.blocks[lease]
            self.arena.free(entry[0], entry[1])


def _shm_too_small(name: str, have: int, need: int) -> Err:
    return Err("INTERNAL", f"shared memory size specified with the request for output '{name}' "
                           f"({have} bytes) should be at least {need} bytes to hold the results")


def write_outputs(
    per_request: list[tuple[dict[str, np.ndarray] | None, list[OutputSpec], Err | None]],
    maps: SegmentMaps,
    leases: Leases,
) -> list[ExecResult]:
    """Turn backend outputs into descriptors; large ones share one arena block."""
    results: list[ExecResult] = []
    large: list[tuple[TensorDesc, memoryview | bytes, int]] = []
    for req_index, (outputs, specs, err) in enumerate(per_request):
        if err is not None or outputs is None:
            results.append(ExecResult(error=err))
            continue
        by_name = {s.name: s for s in specs}
        descs: list[TensorDesc] = []
        error: Err | None = None
        for name, arr in outputs.items():
            arr = np.asarray(arr)
            datatype = numpy_to_wire(arr.dtype)
            payload = array_to_bytes(arr, datatype)
            size = len(payload) if isinstance(payload, bytes) else payload.nbytes
            spec = by_name.get(name)
            desc = TensorDesc(name, datatype, list(arr.shape))
            if spec is not None and spec.seg:
                if size > spec.nbytes:
                    error = _shm_too_small(name, spec.nbytes, size)
                    break
                try:
                    _write_region(maps, spec, payload, size)
                except Exception as e:  # region vanished or shrank, CUDA copy failed
                    error = Err("INTERNAL", f"failed to write output '{name}' to shared memory: {e}")
                    break
                desc.region = spec.region
                desc.nbytes = size
            elif size <= INLINE_MAX:
                desc.data = bytes(payload)
            else:
                large.append((desc, payload, req_index))
            descs.append(desc)
        results.append(ExecResult(error=error) if error else ExecResult(outputs=descs))
    if large:
        sizes = [(len(p) if isinstance(p, bytes) else p.nbytes) for _, p, _ in large]
        total = sum((s + ALIGN - 1) & ~(ALIGN - 1) for s in sizes)
        block = leases.arena.alloc(total)
        holders = {i for _, _, i in large if results[i].error is None}
        lease = leases.add(block.seg, block.offset, max(len(holders), 1))
        off = 0
        for (desc, payload, _), size in zip(large, sizes):
            block.view[off:off + size] = payload
            desc.seg, desc.offset, desc.nbytes, desc.lease = block.seg, block.offset + off, size, lease
            off += (size + ALIGN - 1) & ~(ALIGN - 1)
        if not holders:
            leases.release(lease)
    return results
