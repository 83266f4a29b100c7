"""The worker side of CUDA shared-memory regions, on a CPU-only host: the runtime calls go to
a stand-in that treats a handle as the address of host memory, so opening, the size check,
both copy directions, unmapping and the descriptor plumbing in `workers/tensors.py` run
for real; only the device is simulated. tests/gpu covers the real device."""
from __future__ import annotations

import ctypes
import enum
import struct

import numpy as np
import pytest

from tritond.wire.errors import Code
from tritond.wire.schema import OutputSpec, Region, TensorDesc
from tritond.shm.cuda import CudaMaps, CudaRegionError
from tritond.shm.mapping import SegmentMaps
from tritond.shm.regions import cuda_location
from tritond.workers.tensors import desc_to_array, write_outputs


class FakeRuntime:
    """Just enough of cuda.bindings.runtime; a handle's first 8 bytes are a host address."""

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorInvalidDevice = 101

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    cudaIpcMemLazyEnablePeerAccess = 1

    class cudaIpcMemHandle_t:
        def __init__(self) -> None:
            self._buf = ctypes.create_string_buffer(64)

        def getPtr(self) -> int:
            return ctypes.addressof(self._buf)

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self.closed: list[int] = []
        self.copies: list[tuple[int, int]] = []

    def cudaSetDevice(self, device):
        ok = 0 <= device < self.devices
        return (self.cudaError_t.cudaSuccess if ok else self.cudaError_t.cudaErrorInvalidDevice,)

    def cudaIpcOpenMemHandle(self, handle, flags):
        (address,) = struct.unpack_from("<Q", ctypes.string_at(handle.getPtr(), 64))
        return self.cudaError_t.cudaSuccess, address

    def cudaMemcpy(self, dst, src, count, kind):
        ctypes.memmove(dst, src, count)
        self.copies.append((int(kind), count))
        return (self.cudaError_t.cudaSuccess,)

    def cudaIpcCloseMemHandle(self, ptr):
        self.closed.append(ptr)
        return (self.cudaError_t.cudaSuccess,)


@pytest.fixture
def device():
    """(maps, fake runtime, "device" buffer, its location) for a 256-byte region."""
    buf = (ctypes.c_uint8 * 256)()
    handle = struct.pack("<Q", ctypes.addressof(buf)).ljust(64, b"\0")
    maps = SegmentMaps()
    rt = FakeRuntime()
    maps.cuda._rt = rt
    maps.cuda._allocation_size = lambda ptr: 256
    yield maps, rt, buf, cuda_location(0, 256, handle)
    maps.close()


def test_input_is_copied_from_the_device_once(device):
    maps, rt, buf, loc = device
    data = np.arange(16, dtype=np.float32)
    ctypes.memmove(ctypes.addressof(buf) + 64, data.ctypes.data, data.nbytes)
    arr = desc_to_array(TensorDesc("INPUT0", "FP32", [4, 4], Region("gpu", 64, 64, loc)), maps)
    np.testing.assert_array_equal(arr, data.reshape(4, 4))
    assert rt.copies == [(FakeRuntime.cudaMemcpyKind.cudaMemcpyDeviceToHost, 64)]


def test_output_is_copied_to_the_device_and_described(device):
    maps, rt, buf, loc = device
    out = np.arange(8, dtype=np.int32)
    spec = OutputSpec("OUTPUT0", region=Region("gpu", 128, 64, loc))
    (result,) = write_outputs([({"OUTPUT0": out}, [spec], None)], maps, leases=None)
    assert result.error is None
    (desc,) = result.outputs
    assert (desc.loc, desc.shape) == (Region("gpu", 128, 32, loc), [8])
    np.testing.assert_array_equal(np.frombuffer(bytes(buf)[128:160], dtype=np.int32), out)
    assert rt.copies == [(FakeRuntime.cudaMemcpyKind.cudaMemcpyHostToDevice, 32)]


def test_output_too_large_for_the_cuda_region(device):
    maps, rt, buf, loc = device
    spec = OutputSpec("OUTPUT0", region=Region("gpu", 0, 16, loc))
    (result,) = write_outputs([({"OUTPUT0": np.zeros(8, np.float32)}, [spec], None)], maps, leases=None)
    assert result.error.code is Code.INTERNAL
    assert "should be at least 32 bytes" in result.error.message
    assert rt.copies == []


def test_handle_opened_once_and_closed_on_unmap(device):
    maps, rt, buf, loc = device
    first = maps.cuda.pointer(loc)
    assert maps.cuda.pointer(loc) == first
    maps.drop(loc)
    assert rt.closed == [first[0]]
    maps.drop(loc)                                   # a second Unmap is harmless
    assert rt.closed == [first[0]]


def test_registered_size_larger_than_the_allocation(device):
    maps, rt, buf, loc = device
    maps.cuda._allocation_size = lambda ptr: 128
    with pytest.raises(CudaRegionError, match="exceeds the CUDA allocation"):
        maps.cuda.pointer(loc)
    assert len(rt.closed) == 1


def test_unknown_device_is_a_clear_error(device):
    maps, rt, buf, loc = device
    rt.devices = 0
    with pytest.raises(CudaRegionError, match="cudaSetDevice failed: cudaErrorInvalidDevice"):
        maps.cuda.read(loc, 0, 4)


def test_write_failure_becomes_the_requests_error(device):
    maps, rt, buf, loc = device
    rt.devices = 0
    spec = OutputSpec("OUTPUT0", region=Region("gpu", 0, 64, loc))
    (result,) = write_outputs([({"OUTPUT0": np.zeros(4, np.float32)}, [spec], None)], maps, leases=None)
    assert result.error.code is Code.INTERNAL
    assert result.error.message.startswith("failed to write output 'OUTPUT0' to shared memory: cudaSetDevice failed")


def test_without_cuda_python_the_error_says_so(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name.startswith("cuda"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(CudaRegionError, match="needs the 'cuda-python' package"):
        CudaMaps().pointer(cuda_location(0, 64, bytes(64)))
