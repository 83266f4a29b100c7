"""Tensor descriptors <-> arrays inside a worker.

Inputs become views on shared memory (no copy), including a client's system region; an
input in a CUDA region is copied to the host once; an input handed over by CUDA IPC handle
is opened in place (a DeviceArray) for a backend that computes on the device, else copied
to the host once. Outputs are written once: a device output whose consumer opens device
memory (`OutputSpec.device_ok`) is exported by handle and never leaves the device; any
other output goes into a client's region (system or CUDA; device-to-device into a CUDA
region), inline (small), or into one arena block shared by the whole batch.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterator

import numpy as np

from tritond.repository.datatypes import WIRE_TO_NUMPY, array_to_bytes, bytes_to_array, numpy_to_wire
from tritond.shm.arena import ALIGN, Arena
from tritond.shm.mapping import SegmentMaps
from tritond.shm.regions import CUDA_PREFIX
from tritond.wire.errors import TritonError, internal
from tritond.wire.schema import (
    INLINE_BUDGET, INLINE_MAX, Block, Device, ExecResult, Inline, OutputSpec, Region, TensorDesc, Zeros,
)

from .cuda_ipc import CudaIpcError, DeviceArray, Exports, Imports, IpcRef, check, cuda_runtime, device_array, export

log = logging.getLogger("tritond.worker")

# The fixed-size datatypes both ways, for the common small tensor read from and sent inline.
_FIXED_NUMPY = {wire: dtype for wire, dtype in WIRE_TO_NUMPY.items() if wire not in ("BYTES", "BF16")}
_FIXED_WIRE = {dtype: wire for wire, dtype in _FIXED_NUMPY.items()}


def desc_to_array(desc: TensorDesc, maps: SegmentMaps, imports: Imports | None = None,
                  on_device: bool = False) -> np.ndarray | DeviceArray:
    """The array a descriptor names. One handed over by CUDA IPC handle is opened through
    `imports` and stays a DeviceArray when `on_device`, else it is copied to the host."""
    loc = desc.loc
    if isinstance(loc, Inline):
        dtype = _FIXED_NUMPY.get(desc.datatype)
        if dtype is not None:       # a view on the received bytes, made at once where they fit exactly
            nbytes = dtype.itemsize
            for d in desc.shape:
                if d < 0:
                    break
                nbytes *= d
            else:
                if nbytes == len(loc.data):
                    return np.ndarray(desc.shape, dtype, loc.data)
        return bytes_to_array(loc.data, desc.datatype, desc.shape)
    if isinstance(loc, Zeros):
        if desc.datatype == "BYTES":
            return np.full(desc.shape, b"", dtype=object)
        return np.zeros(desc.shape, WIRE_TO_NUMPY[desc.datatype])
    if isinstance(loc, Device):
        return _open_device(desc, loc, imports, on_device)
    key = loc.key if isinstance(loc, Region) else loc.seg
    if not key:
        raise ValueError(f"'{desc.name}' names a shared-memory region the server did not resolve")
    if key.startswith(CUDA_PREFIX):
        return bytes_to_array(maps.cuda.read(key, loc.offset, loc.nbytes), desc.datatype, desc.shape)
    return bytes_to_array(maps.view(key, loc.offset, loc.nbytes), desc.datatype, desc.shape)


def _open_device(desc: TensorDesc, loc: Device, imports: Imports | None, on_device: bool) -> np.ndarray | DeviceArray:
    if imports is None:
        raise ValueError(f"'{desc.name}' is in another process's device memory, which this caller cannot open")
    if desc.datatype == "BYTES":
        raise ValueError(f"'{desc.name}' is a BYTES tensor, which never travels as device memory")
    ref = IpcRef(loc.handle, loc.offset, loc.nbytes, loc.device)
    array = imports.open(ref, desc.shape, WIRE_TO_NUMPY[desc.datatype])
    return array if on_device else array.copy_to_host()


def _write_region(maps: SegmentMaps, region: Region, payload: memoryview | bytes | DeviceArray, size: int) -> None:
    if isinstance(payload, DeviceArray):
        _copy_device_to_region(maps, region, payload)
        return
    if region.key.startswith(CUDA_PREFIX):
        maps.cuda.write(region.key, region.offset, payload)
        return
    dst = maps.view(region.key, region.offset, size)
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


def _copy_device_to_region(maps: SegmentMaps, region: Region, array: DeviceArray) -> None:
    """A device output into a client's CUDA region, device to device (no host staging).
    The copy is waited for: the client reads the region as soon as it has the reply."""
    if not array.nbytes:
        return
    dst, _device = maps.cuda.pointer(region.key)
    cudart = cuda_runtime()
    check(cudart.cudaMemcpy(dst + region.offset, array.ptr, array.nbytes,
                            cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice), "cudaMemcpy")
    check(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


class Leases:
    """Output blocks handed to consumers; a block is freed when every holder released it.

    `ids` may be shared with the worker's CUDA IPC exports, so one Release names either kind."""

    def __init__(self, arena: Arena, ids: Iterator[int] | None = None) -> None:
        self.arena = arena
        self.blocks: dict[int, list] = {}   # lease -> [seg, offset, holders]
        self.ids = ids if ids is not None else itertools.count(1)

    def add(self, seg: str, offset: int, holders: int) -> int:
        lease = next(self.ids)
        self.blocks[lease] = [seg, offset, holders]
        return lease

    def release(self, lease: int) -> None:
        entry = self.blocks.get(lease)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] <= 0:
            del self.blocks[lease]
            self.arena.free(entry[0], entry[1])


def _shm_too_small(name: str, have: int, need: int) -> TritonError:
    return internal(f"shared memory size specified with the request for output '{name}' "
                    f"({have} bytes) should be at least {need} bytes to hold the results")


def _exported(name: str, array: DeviceArray, imports: Imports | None) -> TensorDesc | None:
    """The descriptor of a device output handed on by CUDA IPC handle; None when it cannot be
    (memory this worker itself opened, or the runtime refuses), and it goes through the host."""
    if imports is not None and imports.holds(array):
        return None
    try:
        ref = export(array)
    except CudaIpcError as e:
        log.debug("output '%s' cannot be exported by CUDA IPC handle, copied to the host: %s", name, e)
        return None
    return TensorDesc(name, numpy_to_wire(array.dtype), list(array.shape),
                      Device(ref.handle, ref.device, ref.offset, ref.nbytes))


def write_outputs(
    per_request: list[tuple[dict[str, Any] | None, list[OutputSpec], TritonError | None]],
    maps: SegmentMaps,
    leases: Leases,
    exports: Exports | None = None,
    imports: Imports | None = None,
    inline_budget: int = INLINE_BUDGET,
) -> list[ExecResult]:
    """Turn backend outputs into descriptors. Large host ones share one arena block; device
    ones whose spec says `device_ok` are exported under one lease of `exports` (held by every
    request referencing them); other device outputs are copied out of the device."""
    results: list[ExecResult] = []
    large: list[tuple[TensorDesc, memoryview | bytes, int]] = []
    on_device: list[tuple[TensorDesc, DeviceArray, int]] = []
    inline_total = 0        # keeps the reply frame far below the sockets' size limit
    for req_index, (outputs, specs, err) in enumerate(per_request):
        if err is not None or outputs is None:
            results.append(ExecResult(error=err))
            continue
        by_name = {s.name: s for s in specs}
        descs: list[TensorDesc] = []
        error: TritonError | None = None
        for name, value in outputs.items():
            spec = by_name.get(name) or OutputSpec(name)
            region = spec.region
            if region is None and type(value) is np.ndarray and value.dtype in _FIXED_WIRE:
                size = value.nbytes
                if size <= INLINE_MAX and inline_total + size <= inline_budget:    # one copy, in C order
                    descs.append(TensorDesc(name, _FIXED_WIRE[value.dtype], list(value.shape), Inline(value.tobytes())))
                    inline_total += size
                    continue
            try:
                device = device_array(value)
                if device is not None and spec.device_ok and exports is not None:
                    desc = _exported(name, device, imports)
                    if desc is not None:
                        on_device.append((desc, device, req_index))
                        descs.append(desc)
                        continue
                if device is not None and not (region is not None and region.key.startswith(CUDA_PREFIX)):
                    value, device = device.copy_to_host(), None
            except Exception as e:  # a strided device tensor, a failed device-to-host copy
                error = internal(f"failed to read output '{name}' from the device: {e}")
                break
            if device is not None:      # bound for a client's CUDA region: stays on the device
                datatype, shape, payload, size = numpy_to_wire(device.dtype), device.shape, device, device.nbytes
            else:
                try:
                    arr = np.asarray(value)
                    datatype, shape = numpy_to_wire(arr.dtype), arr.shape
                    payload = array_to_bytes(arr, datatype)
                except (ValueError, TypeError) as e:  # complex, ragged or otherwise unservable
                    error = internal(f"model returned output '{name}' that cannot be sent: {e}")
                    break
                size = len(payload) if isinstance(payload, bytes) else payload.nbytes
            if region is not None:
                if size > region.nbytes:
                    error = _shm_too_small(name, region.nbytes, size)
                    break
                try:
                    _write_region(maps, region, payload, size)
                except Exception as e:  # region vanished or shrank, CUDA copy failed
                    error = internal(f"failed to write output '{name}' to shared memory: {e}")
                    break
                desc = TensorDesc(name, datatype, list(shape), Region(region.name, region.offset, size, region.key))
            elif size <= INLINE_MAX and inline_total + size <= inline_budget:
                desc = TensorDesc(name, datatype, list(shape), Inline(bytes(payload)))
                inline_total += size
            else:
                desc = TensorDesc(name, datatype, list(shape), Inline(b""))     # placed below
                large.append((desc, payload, req_index))
            descs.append(desc)
        results.append(ExecResult(error=error) if error else ExecResult(outputs=descs))
    if large:
        sizes = [(len(p) if isinstance(p, bytes) else p.nbytes) for _, p, _ in large]
        total = sum((s + ALIGN - 1) & ~(ALIGN - 1) for s in sizes)
        try:
            block = leases.arena.alloc(total)
        except TritonError as e:        # /dev/shm is full: these requests fail, the worker lives
            for _, _, i in large:
                results[i] = ExecResult(error=e)
            large = []
    if large:
        holders = {i for _, _, i in large if results[i].error is None}
        lease = leases.add(block.seg, block.offset, max(len(holders), 1))
        off = 0
        for (desc, payload, _), size in zip(large, sizes):
            block.view[off:off + size] = payload
            desc.loc = Block(block.seg, block.offset + off, size, lease)
            off += (size + ALIGN - 1) & ~(ALIGN - 1)
        if not holders:
            leases.release(lease)
    if on_device:
        holders = {i for _, _, i in on_device if results[i].error is None}
        if holders:
            lease = exports.add([a for _, a, i in on_device if i in holders], len(holders))
            for desc, _, _ in on_device:
                desc.loc.lease = lease
    return results
