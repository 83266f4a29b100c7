"""CUDA IPC bookkeeping that needs no GPU: device-array views, the cuda array interface,
lease counting of exports, and handle validation. The hand-off itself runs in tests/gpu."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.wire import schema as P
from tritond.workers.cuda_ipc import HANDLE_SIZE, CudaIpcError, DeviceArray, Exports, IpcRef, Imports


def test_slices_are_views_along_the_batch_axis():
    arr = DeviceArray(0x10000, (6, 4), np.dtype(np.float32), device=1, owner="tensor")
    part = arr[2:5]
    assert part.ptr == 0x10000 + 2 * 16 and part.shape == (3, 4)
    assert part.device == 1 and part.owner == "tensor" and part.nbytes == 48
    assert len(arr) == 6 and arr.ndim == 2
    with pytest.raises(TypeError):
        arr[::2]


def test_cuda_array_interface():
    arr = DeviceArray(0x2000, (2, 3), np.dtype(np.int64))
    assert arr.__cuda_array_interface__ == {"shape": (2, 3), "typestr": "<i8", "data": (0x2000, False),
                                            "strides": None, "version": 3}


def test_exports_live_until_every_holder_released():
    exports = Exports()
    arr = DeviceArray(0x3000, (1,), np.dtype(np.float32))
    lease = exports.add([arr], holders=2)
    assert not exports.release(lease)
    assert len(exports) == 1
    assert exports.release(lease)
    assert len(exports) == 0
    assert not exports.release(lease)          # a late or repeated release is harmless


def test_a_descriptor_location_is_one_of_four_kinds_and_round_trips():
    dec = P.decoder(P.TensorDesc)
    for loc in (P.Device(b"h" * HANDLE_SIZE, 1, 512, 24, 7), P.Block("/s", 64, 8, 1), P.Inline(b"abcd"),
                P.Region("r", 0, 8, "/k")):
        desc = P.TensorDesc("OUT", "FP32", [2], loc)
        assert dec.decode(P.encode(desc)) == desc
    with pytest.raises(P.DecodeError):
        dec.decode(P.encode(["OUT", "FP32", [2], ["x", 1]]))


def test_a_malformed_handle_is_refused():
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    with pytest.raises(CudaIpcError, match="64 bytes"):
        Imports().open(IpcRef(b"short", 0, 4, 0), (1,), np.float32)


def test_host_copy_of_a_torch_owned_slice():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    owner = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    arr = DeviceArray(int(owner.data_ptr()), (3, 4), np.dtype(np.float32), owner=owner)
    np.testing.assert_array_equal(np.asarray(arr[1:3]), owner[1:3].numpy())
    bf16 = torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16).view(torch.int16)
    bits = DeviceArray(int(bf16.data_ptr()), (3,), np.dtype(np.uint16), owner=bf16)
    assert np.asarray(bits[1:]).tolist() == bf16[1:].numpy().view(np.uint16).tolist()
