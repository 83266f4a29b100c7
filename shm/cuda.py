"""CUDA shared-memory regions inside a worker: a client's `cudaIpcMemHandle_t`, opened with
`cudaIpcOpenMemHandle` on the region's device.

cuda-python (`cuda.bindings`) is imported on first use, so CPU-only installs never load it.
The backends here compute on the host, so an input in a CUDA region is copied device→host
once (cudaMemcpy) into the array the backend sees, and an output is copied host→device once
into the region; nothing else touches the bytes. A handle is opened once per worker and
closed when the broker says the region is gone (`Unmap`).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .regions import parse_cuda_location


class CudaRegionError(Exception):
    pass


class CudaMaps:
    def __init__(self) -> None:
        self._rt: Any = None
        self._open: dict[str, tuple[int, int]] = {}   # location -> (device pointer, device)

    def _runtime(self) -> Any:
        if self._rt is None:
            try:
                from cuda.bindings import runtime
            except ImportError:
                raise CudaRegionError("CUDA shared memory needs the 'cuda-python' package on the server") from None
            self._rt = runtime
        return self._rt

    def _call(self, fn: Any, *args: Any) -> Any:
        rt = self._runtime()
        out = fn(*args)
        err = out[0] if isinstance(out, tuple) else out
        if err != rt.cudaError_t.cudaSuccess:
            raise CudaRegionError(f"{fn.__name__} failed: {getattr(err, 'name', err)}")
        if isinstance(out, tuple) and len(out) > 1:
            return out[1] if len(out) == 2 else out[1:]
        return None

    def _allocation_size(self, ptr: int) -> int | None:
        """Bytes from `ptr` to the end of its allocation, or None when the driver will not say."""
        try:
            from cuda.bindings import driver
        except ImportError:
            return None
        err, base, size = driver.cuMemGetAddressRange(driver.CUdeviceptr(ptr))
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        return int(size) - (ptr - int(base))

    def pointer(self, location: str) -> tuple[int, int]:
        """(device pointer, device) of an opened region; opens the handle on first use."""
        entry = self._open.get(location)
        if entry is not None:
            return entry
        device, byte_size, raw = parse_cuda_location(location)
        rt = self._runtime()
        self._call(rt.cudaSetDevice, device)
        handle = rt.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw, len(raw))
        ptr = int(self._call(rt.cudaIpcOpenMemHandle, handle, rt.cudaIpcMemLazyEnablePeerAccess))
        available = self._allocation_size(ptr)
        if available is not None and byte_size > available:
            self._call(rt.cudaIpcCloseMemHandle, ptr)
            raise CudaRegionError("the registered byte size exceeds the CUDA allocation")
        self._open[location] = (ptr, device)
        return ptr, device

    def read(self, location: str, offset: int, nbytes: int) -> memoryview:
        """Copy [offset, offset+nbytes) of the region to host memory."""
        ptr, device = self.pointer(location)
        host = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            rt = self._rt
            self._call(rt.cudaSetDevice, device)
            self._call(rt.cudaMemcpy, host.ctypes.data, ptr + offset, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return memoryview(host)

    def write(self, location: str, offset: int, payload: bytes | memoryview) -> None:
        """Copy host bytes into the region at `offset`."""
        ptr, device = self.pointer(location)
        src = np.frombuffer(payload, dtype=np.uint8)
        if src.size:
            rt = self._rt
            self._call(rt.cudaSetDevice, device)
            self._call(rt.cudaMemcpy, ptr + offset, src.ctypes.data, src.size, rt.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def drop(self, location: str) -> None:
        entry = self._open.pop(location, None)
        if entry is not None:
            try:
                self._call(self._rt.cudaIpcCloseMemHandle, entry[0])
            except CudaRegionError:
                pass  # the client freed it first; nothing left to close

    def close(self) -> None:
        for location in list(self._open):
            self.drop(location)
