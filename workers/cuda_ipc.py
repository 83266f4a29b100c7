"""CUDA IPC hand-off of device tensors between worker processes (DESIGN §2, loc "cuda").

A GPU worker's output can stay in device memory: its descriptor then carries the CUDA IPC
handle of the allocation that holds it, the tensor's offset inside that allocation and the
device. A consumer in another process opens the handle (`cudaIpcOpenMemHandle`) and reads
the tensor in place, so the data never makes a device -> host -> device trip.

Lifetimes follow the lease rule: the producer keeps the tensor (and so its allocation)
alive in `Exports` until every holder has released its lease; a consumer closes what it
opened (`Imports.close`) once its batch is done. CUDA reference-counts opens of the same
handle inside one process, so every open is paired with exactly one close.

cuda-python (`cuda.bindings`) is imported on first use, so CPU-only workers never load it.
"""
from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

HANDLE_SIZE = 64


class CudaIpcError(RuntimeError):
    pass


def cuda_runtime():
    try:
        import cuda.bindings.runtime as cudart
    except ImportError as e:
        raise CudaIpcError("CUDA IPC needs cuda-python (pip install cuda-python): " + str(e)) from None
    return cudart


def cuda_driver():
    try:
        import cuda.bindings.driver as cuda
    except ImportError as e:
        raise CudaIpcError("CUDA IPC needs cuda-python (pip install cuda-python): " + str(e)) from None
    return cuda


def check(result: tuple, what: str) -> Any:
    """Unwrap a cuda-python (err, value...) tuple, raising on any error."""
    err, values = result[0], result[1:]
    if int(err) != 0:
        raise CudaIpcError(f"{what} failed: {getattr(err, 'name', err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _typestr(dtype: np.dtype) -> str:
    return np.dtype(dtype).str


@dataclass
class DeviceArray:
    """A C-contiguous tensor in device memory.

    What a GPU backend returns for an output that stays on the device, and what a consumer
    gets for an input that arrived by IPC handle. `owner` keeps the memory alive (a torch
    tensor, or the import it came from). It exposes `__cuda_array_interface__`, so torch,
    CuPy and numba take it without a copy, and `__array__`, so code that expects numpy gets
    a host copy instead of an error.
    """
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: int = 0         # CUDA ordinal as this process sees it
    owner: Any = None

    @classmethod
    def from_torch(cls, tensor: Any) -> "DeviceArray":
        """Wrap a CUDA torch tensor (made contiguous; BF16 travels as its uint16 bits)."""
        import torch
        t = tensor.detach().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
            dtype = np.dtype(np.uint16)
        else:
            dtype = torch.empty((), dtype=t.dtype).numpy().dtype
        return cls(int(t.data_ptr()), tuple(t.shape), dtype, t.device.index or 0, t)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice) -> "DeviceArray":
        """Rows along axis 0 (how a batch output is split per request), as a view."""
        if not isinstance(index, slice) or not self.shape:
            raise TypeError("a DeviceArray can only be sliced along its first axis")
        start, stop, step = index.indices(self.shape[0])
        if step != 1:
            raise TypeError("a DeviceArray slice must be contiguous")
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        return DeviceArray(self.ptr + start * row, (max(stop - start, 0),) + tuple(self.shape[1:]),
                           self.dtype, self.device, self.owner)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": tuple(self.shape), "typestr": _typestr(self.dtype), "data": (self.ptr, False),
                "strides": None, "version": 3}

    def copy_to_host(self) -> np.ndarray:
        owner = self.owner
        if hasattr(owner, "data_ptr") and hasattr(owner, "cpu"):    # a torch tensor: torch copies it
            count = int(np.prod(self.shape, dtype=np.int64))
            start = (self.ptr - int(owner.data_ptr())) // owner.element_size()
            host = owner.reshape(-1)[start:start + count].cpu().numpy()
            return host.view(self.dtype).reshape(self.shape)
        out = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            cudart = cuda_runtime()
            check(cudart.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes,
                                     cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.copy_to_host()
        return host if dtype is None else host.astype(dtype, copy=False)


def device_array(value: Any) -> DeviceArray | None:
    """`value` as a DeviceArray when it lives in device memory (a DeviceArray, a CUDA torch
    tensor, anything with a C-contiguous `__cuda_array_interface__`), else None."""
    if isinstance(value, DeviceArray):
        return value
    if hasattr(value, "data_ptr") and hasattr(value, "is_cuda"):      # torch, on the device or not
        return DeviceArray.from_torch(value) if value.is_cuda else None
    if not hasattr(value, "__cuda_array_interface__"):
        return None
    cai = value.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, dtype.itemsize):
        raise CudaIpcError("a device tensor must be C-contiguous to be handed on")
    device = getattr(getattr(value, "device", None), "id", 0)     # CuPy names its device; else the worker's one GPU
    return DeviceArray(int(cai["data"][0]), shape, dtype, int(device or 0), value)


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


@dataclass
class IpcRef:
    """Where a device tensor lives, as another process can open it."""
    handle: bytes          # cudaIpcMemHandle_t of the allocation (64 bytes)
    offset: int            # tensor start inside that allocation
    nbytes: int
    device: int            # the producer's CUDA ordinal (a consumer opens on its current device)


def _handle_bytes(handle: Any) -> bytes:
    # cuda-bindings >= 13 exposes only the struct's address; read its bytes from there.
    return bytes((ctypes.c_char * HANDLE_SIZE).from_address(handle.getPtr()))


def _handle_from_bytes(data: bytes) -> Any:
    if len(data) != HANDLE_SIZE:
        raise CudaIpcError(f"a CUDA IPC handle is {HANDLE_SIZE} bytes, got {len(data)}")
    handle = cuda_runtime().cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), data, HANDLE_SIZE)
    return handle


def export(array: DeviceArray) -> IpcRef:
    """The IPC handle of the allocation holding `array` and the array's offset in it.

    Caching allocators (PyTorch's) carve tensors out of larger allocations, and a handle
    always names a whole allocation, so the base comes from cuMemGetAddressRange.
    """
    cudart, cuda = cuda_runtime(), cuda_driver()
    check(cudart.cudaSetDevice(array.device), "cudaSetDevice")    # makes the device's context current
    base, _size = check(cuda.cuMemGetAddressRange(array.ptr), "cuMemGetAddressRange")
    base = int(base)
    handle = check(cudart.cudaIpcGetMemHandle(base), "cudaIpcGetMemHandle")
    return IpcRef(_handle_bytes(handle), array.ptr - base, array.nbytes, array.device)


class Exports:
    """Device arrays handed out by IPC handle; each is kept alive until its holders release it.

    `ids` may be shared with the worker's arena leases, so one Release names either kind."""

    def __init__(self, ids: Iterator[int] | None = None) -> None:
        self.entries: dict[int, list] = {}    # lease -> [arrays, holders]
        self.ids = ids if ids is not None else itertools.count(1)

    def add(self, arrays: list[DeviceArray], holders: int = 1) -> int:
        lease = next(self.ids)
        self.entries[lease] = [list(arrays), max(holders, 1)]
        return lease

    def release(self, lease: int) -> bool:
        """Drop one holder; True when the arrays were let go (their memory may be reused)."""
        entry = self.entries.get(lease)
        if entry is None:
            return False
        entry[1] -= 1
        if entry[1] > 0:
            return False
        del self.entries[lease]
        return True

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, lease: int) -> bool:
        return lease in self.entries


class Imports:
    """Mappings of other processes' device memory that this process opened."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.spans: list[tuple[int, int]] = []     # [start, end) of each tensor opened

    def open(self, ref: IpcRef, shape: tuple[int, ...] | list[int], dtype: np.dtype) -> DeviceArray:
        cudart = cuda_runtime()
        handle = _handle_from_bytes(ref.handle)
        base = int(check(cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess),
                          "cudaIpcOpenMemHandle"))
        self.opened.append(base)
        array = DeviceArray(base + ref.offset, tuple(shape), np.dtype(dtype), ref.device, self)
        if array.nbytes > ref.nbytes:
            raise CudaIpcError(f"tensor of {array.nbytes} bytes does not fit the {ref.nbytes} bytes exported")
        self.spans.append((base + ref.offset, base + ref.offset + ref.nbytes))
        return array

    def holds(self, array: DeviceArray) -> bool:
        """True when `array` lies in memory opened here (a model that returns its input): such
        memory is another process's and is unmapped at `close`, so it cannot be handed on."""
        return any(start <= array.ptr < end for start, end in self.spans)

    def close(self) -> None:
        """Close every mapping opened since the last close (call once the consumer is done)."""
        if not self.opened:
            return
        cudart = cuda_runtime()
        opened, self.opened, self.spans = self.opened, [], []
        failed = [base for base in opened if int(cudart.cudaIpcCloseMemHandle(base)[0]) != 0]
        if failed:
            raise CudaIpcError(f"cudaIpcCloseMemHandle failed for {len(failed)} of {len(opened)} mapping(s)")
