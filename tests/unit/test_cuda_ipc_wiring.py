"""CUDA IPC wired through the worker and the ensemble runner, on a CPU-only host.

`cuda.bindings` is replaced by a stand-in in which device memory is host memory and a
handle carries its allocation's address, so exporting, opening, copying and closing run
for real through `workers/cuda_ipc.py`, `workers/tensors.py` and the worker loop; only the
device is simulated. tests/gpu/test_gpu_ensemble_ipc.py runs the same path on a GPU."""
from __future__ import annotations

import asyncio
import ctypes
import enum
import struct
import sys
import types

import numpy as np
import pytest
from broker_harness import Harness, ensemble_model, python_model

from tritond.frontend.dataplane import Dataplane, InputTensor, OutputRequest, RequestOptions
from tritond.repository.view import model_view
from tritond.shm.mapping import SegmentMaps
from tritond.shm.regions import cuda_location
from tritond.workers.backends.base import Backend, InstanceInfo, WorkerResponse
from tritond.workers.cuda_ipc import CudaIpcError, DeviceArray, Exports, Imports, device_array
from tritond.workers.main import Worker
from tritond.workers.responses import Flow
from tritond.workers.states import SequenceStates
from tritond.workers.tensors import Leases, desc_to_array, write_outputs
from tritond.wire import schema as P
from tritond.wire.errors import internal


class Ok(enum.IntEnum):
    cudaSuccess = 0
    CUDA_SUCCESS = 0


class FakeCuda:
    """The runtime and driver calls the server makes; device pointers are host addresses."""

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2
        cudaMemcpyDeviceToDevice = 3

    class cudaIpcMemHandle_t:
        def __init__(self) -> None:
            self._buf = ctypes.create_string_buffer(64)

        def getPtr(self) -> int:
            return ctypes.addressof(self._buf)

    cudaIpcMemLazyEnablePeerAccess = 1

    def __init__(self) -> None:
        self.allocations: dict[int, ctypes.Array] = {}     # base -> buffer
        self.opened: list[int] = []
        self.closed: list[int] = []
        self.copies: list[str] = []

    def alloc(self, data: np.ndarray) -> DeviceArray:
        """A device allocation holding `data` (the 'model output')."""
        buf = ctypes.create_string_buffer(max(data.nbytes, 1))
        ctypes.memmove(buf, np.ascontiguousarray(data).ctypes.data, data.nbytes)
        self.allocations[ctypes.addressof(buf)] = buf
        return DeviceArray(ctypes.addressof(buf), data.shape, data.dtype, 0, buf)

    def cudaSetDevice(self, device):
        return (Ok.cudaSuccess,)

    def cuMemGetAddressRange(self, ptr):
        for base, buf in self.allocations.items():
            if base <= int(ptr) < base + len(buf):
                return Ok.CUDA_SUCCESS, base, len(buf)
        return (1, 0, 0)

    def cudaIpcGetMemHandle(self, base):
        handle = self.cudaIpcMemHandle_t()
        struct.pack_into("<Q", handle._buf, 0, base)
        return Ok.cudaSuccess, handle

    def cudaIpcOpenMemHandle(self, handle, flags):
        (base,) = struct.unpack_from("<Q", ctypes.string_at(handle.getPtr(), 8))
        self.opened.append(base)
        return Ok.cudaSuccess, base

    def cudaIpcCloseMemHandle(self, base):
        self.closed.append(base)
        return (Ok.cudaSuccess,)

    def cudaMemcpy(self, dst, src, count, kind):
        ctypes.memmove(dst, src, count)
        self.copies.append(self.cudaMemcpyKind(kind).name)
        return (Ok.cudaSuccess,)

    def cudaDeviceSynchronize(self):
        return (Ok.cudaSuccess,)


@pytest.fixture
def cuda(monkeypatch) -> FakeCuda:
    """Install the stand-in as cuda.bindings.runtime / .driver for the lazy imports."""
    fake = FakeCuda()
    runtime = types.ModuleType("cuda.bindings.runtime")
    driver = types.ModuleType("cuda.bindings.driver")
    for name in dir(fake):
        if name.startswith("cu"):
            setattr(runtime, name, getattr(fake, name))
            setattr(driver, name, getattr(fake, name))
    runtime.cudaError_t = Ok
    driver.CUresult = Ok
    driver.CUdeviceptr = int
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime, bindings.driver = runtime, driver
    package = types.ModuleType("cuda")
    package.bindings = bindings
    for name, module in (("cuda", package), ("cuda.bindings", bindings), ("cuda.bindings.runtime", runtime),
                         ("cuda.bindings.driver", driver)):
        monkeypatch.setitem(sys.modules, name, module)
    return fake


@pytest.fixture
def maps():
    m = SegmentMaps()
    yield m
    m.close()


class FakeArena:
    def __init__(self) -> None:
        self.freed: list[tuple[str, int]] = []

    def free(self, seg: str, offset: int) -> None:
        self.freed.append((seg, offset))


# ---------------------------------------------------------------------- the producing worker

def test_device_outputs_are_exported_only_where_the_consumer_takes_device_memory(cuda, maps):
    exports = Exports()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(6, dtype=np.int64)
    specs = [P.OutputSpec("A", device_ok=True), P.OutputSpec("B")]
    (result,) = write_outputs([({"A": cuda.alloc(a), "B": cuda.alloc(b)}, specs, None)], maps, None, exports)
    assert result.error is None
    da, db = result.outputs
    assert (da.name, da.datatype, da.shape) == ("A", "FP32", [3, 4])
    assert isinstance(da.loc, P.Device) and (da.loc.offset, da.loc.nbytes, da.loc.device) == (0, 48, 0)
    assert len(da.loc.handle) == 64 and da.loc.lease in exports
    assert isinstance(db.loc, P.Inline) and P.lease_of(db) == 0
    np.testing.assert_array_equal(np.frombuffer(db.loc.data, np.int64), b)    # copied to the host
    assert cuda.copies == ["cudaMemcpyDeviceToHost"]
    assert len(exports) == 1


def test_without_exports_or_device_ok_everything_reaches_the_host(cuda, maps):
    out = np.arange(4, dtype=np.float32)
    (result,) = write_outputs([({"A": cuda.alloc(out)}, [P.OutputSpec("A", device_ok=True)], None)], maps, None)
    (desc,) = result.outputs
    assert isinstance(desc.loc, P.Inline) and np.frombuffer(desc.loc.data, np.float32).tolist() == out.tolist()


def test_one_export_lease_for_the_batch_held_by_each_request(cuda, maps):
    exports = Exports()
    batch = cuda.alloc(np.arange(8, dtype=np.float32).reshape(4, 2))
    spec = [P.OutputSpec("Y", device_ok=True)]
    per_request = [({"Y": batch[0:1]}, spec, None), ({"Y": batch[1:4]}, spec, None),
                   (None, spec, internal("this one failed"))]
    first, second, failed = write_outputs(per_request, maps, None, exports)
    (d1,), (d2,) = first.outputs, second.outputs
    assert failed.error.message == "this one failed"
    a, b = d1.loc, d2.loc
    assert a.lease == b.lease and a.handle == b.handle                   # one allocation, one lease
    assert (a.offset, a.nbytes, b.offset, b.nbytes) == (0, 8, 8, 24)
    assert not exports.release(a.lease)
    assert exports.release(b.lease) and len(exports) == 0


def test_output_into_a_cuda_region_is_copied_device_to_device(cuda, maps):
    region = cuda.alloc(np.zeros(64, np.uint8))
    loc = cuda_location(0, 64, struct.pack("<Q", region.ptr).ljust(64, b"\0"))
    out = np.arange(4, dtype=np.int32)
    spec = P.OutputSpec("OUT", region=P.Region("gpu", 16, 48, loc))
    (result,) = write_outputs([({"OUT": cuda.alloc(out)}, [spec], None)], maps, None, Exports())
    (desc,) = result.outputs
    assert desc.loc == P.Region("gpu", 16, 16, loc)
    assert np.frombuffer(region.owner.raw[16:32], np.int32).tolist() == out.tolist()
    assert cuda.copies == ["cudaMemcpyDeviceToDevice"]


def test_output_too_large_for_its_cuda_region(cuda, maps):
    region = cuda.alloc(np.zeros(8, np.uint8))
    loc = cuda_location(0, 8, struct.pack("<Q", region.ptr).ljust(64, b"\0"))
    spec = P.OutputSpec("OUT", region=P.Region("gpu", 0, 8, loc))
    (result,) = write_outputs([({"OUT": cuda.alloc(np.zeros(4, np.float32))}, [spec], None)], maps, None)
    assert "should be at least 16 bytes" in result.error.message and cuda.copies == []


def test_what_counts_as_device_memory():
    class Foreign:          # e.g. a CuPy array
        def __init__(self, strides):
            self.__cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (0x4000, False),
                                             "strides": strides, "version": 3}

    arr = device_array(Foreign(None))
    assert (arr.ptr, arr.shape, arr.dtype, arr.nbytes) == (0x4000, (2, 3), np.float32, 24)
    assert device_array(Foreign((12, 4))).shape == (2, 3)
    with pytest.raises(CudaIpcError, match="C-contiguous"):
        device_array(Foreign((4, 8)))
    assert device_array(np.zeros(3)) is None
    torch = pytest.importorskip("torch", reason="torch is not installed")
    assert device_array(torch.zeros(3)) is None          # a CPU tensor is host memory


# ---------------------------------------------------------------------- the consuming worker

def exported(cuda, maps, data: np.ndarray) -> tuple[P.TensorDesc, Exports]:
    exports = Exports()
    (result,) = write_outputs([({"X": cuda.alloc(data)}, [P.OutputSpec("X", device_ok=True)], None)], maps, None,
                              exports)
    return result.outputs[0], exports


def test_a_handle_opens_in_place_or_is_copied_to_the_host(cuda, maps):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    desc, _ = exported(cuda, maps, data)
    imports = Imports()
    on_device = desc_to_array(desc, maps, imports, on_device=True)
    assert isinstance(on_device, DeviceArray) and on_device.shape == (2, 3) and on_device.dtype == np.float32
    assert on_device.ptr == cuda.opened[0] + desc.loc.offset and cuda.copies == []
    host = desc_to_array(desc, maps, imports)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, data)
    imports.close()
    assert cuda.closed == cuda.opened and len(cuda.opened) == 2    # every open paired with a close


def test_a_handle_without_imports_or_for_bytes_is_refused(cuda, maps):
    desc, _ = exported(cuda, maps, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="cannot open"):
        desc_to_array(desc, maps)
    with pytest.raises(ValueError, match="BYTES"):
        desc_to_array(P.TensorDesc("S", "BYTES", [1], desc.loc), maps, Imports())


class Recorder(Backend):
    """Returns its input as OUT (or a device copy of it) and records what execute() saw."""

    def __init__(self, accepts_device: bool, alias: bool = False, cuda: FakeCuda | None = None) -> None:
        super().__init__({}, P.ModelView(), InstanceInfo("m", 1, "", "", "m_0_0"))
        self.accepts_device_inputs = accepts_device
        self.alias, self.cuda = alias, cuda
        self.seen: list[type] = []

    def execute(self, requests):
        out = []
        for r in requests:
            x = r.inputs["X"]
            self.seen.append(type(x))
            if self.alias:
                y = x
            elif isinstance(x, DeviceArray):
                y = self.cuda.alloc(np.asarray(x) + 1)
            else:
                y = x + 1
            out.append(WorkerResponse({"OUT": y}))
        return out


def worker(maps) -> Worker:
    """The worker loop's state without its sockets and arena."""
    w = Worker.__new__(Worker)
    w.maps, w.arena = maps, FakeArena()
    ids = iter(range(1, 1 << 30))
    w.leases, w.exports, w.imports = Leases(w.arena, ids), Exports(ids), Imports()
    w.decoupled, w.flow, w.states = False, Flow(), SequenceStates([], w.arena, [])
    w.stateful = False
    w.iterative = False
    return w


def exec_msg(desc: P.TensorDesc, device_ok: bool) -> P.Exec:
    return P.Exec(1, [P.ExecRequest([desc], [P.OutputSpec("OUT", device_ok=device_ok)])])


@pytest.mark.parametrize("accepts_device", [True, False])
def test_the_worker_hands_a_backend_what_it_accepts_and_closes_after_the_batch(cuda, maps, accepts_device):
    data = np.arange(4, dtype=np.float32)
    desc, _ = exported(cuda, maps, data)
    w, backend = worker(maps), Recorder(accepts_device, cuda=cuda)
    done = w.execute(backend, exec_msg(desc, device_ok=True))
    assert backend.seen == [DeviceArray if accepts_device else np.ndarray]
    assert cuda.closed == cuda.opened and len(cuda.opened) == 1 and not w.imports.opened
    (out,) = done.results[0].outputs
    if accepts_device:       # computed on the device and handed on by handle again
        assert isinstance(out.loc, P.Device) and out.loc.lease in w.exports
    else:                    # a host backend's output is host memory
        assert np.frombuffer(out.loc.data, np.float32).tolist() == (data + 1).tolist()


def test_an_output_that_is_its_imported_input_is_not_re_exported(cuda, maps):
    data = np.arange(4, dtype=np.float32)
    desc, _ = exported(cuda, maps, data)
    w = worker(maps)
    done = w.execute(Recorder(True, alias=True), exec_msg(desc, device_ok=True))
    (out,) = done.results[0].outputs
    assert np.frombuffer(out.loc.data, np.float32).tolist() == data.tolist()
    assert len(w.exports) == 0 and cuda.closed == cuda.opened


def test_release_reaches_the_exports_and_arena_leases_alike(cuda, maps):
    w = worker(maps)
    block = w.leases.add("seg", 128, 1)
    desc, _ = exported(cuda, maps, np.zeros(2, np.float32))
    done = w.execute(Recorder(True, cuda=cuda), exec_msg(desc, device_ok=True))
    (out,) = done.results[0].outputs
    assert out.loc.lease != block and out.loc.lease in w.exports
    assert w.handle_side(P.Release(b"w", [out.loc.lease, block]))
    assert len(w.exports) == 0 and w.arena.freed == [("seg", 128)]


# ---------------------------------------------------------------------- the ensemble runner

CHAIN = """
name: "chain" platform: "ensemble" max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }, { name: "MID" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "gpu_a" model_version: -1 input_map { key: "X" value: "IN" }
    output_map { key: "Y" value: "t1" } output_map { key: "Z" value: "MID" } },
  { model_name: "gpu_b" model_version: -1 input_map { key: "X" value: "t1" } input_map { key: "W" value: "MID" }
    output_map { key: "Y" value: "t2" } },
  { model_name: "cpu_c" model_version: -1 input_map { key: "X" value: "t2" } output_map { key: "Y" value: "OUT" } }
] }
"""
KINDS = {"gpu_a": "GPU", "gpu_b": "GPU", "cpu_c": "CPU"}


@pytest.fixture
def chain(tmp_path) -> Harness:
    """The real broker in-process; the composing models' instances are of the kind in KINDS."""
    for name in KINDS:
        python_model(tmp_path, name, ["X"], ["Y", "Z"],
                     'input { name: "W" data_type: TYPE_FP32 dims: [-1] optional: true }')
    ensemble_model(tmp_path, "chain", CHAIN)
    h = Harness(tmp_path).load("*")
    for name, kind in KINDS.items():
        for inst in h.instances(name):
            inst.kind = kind
    return h


def answer(h: Harness, model: str, lease: int, **outputs: bool) -> P.ExecRequest:
    """Answer a step the way a worker does: an output asked for with device_ok comes back as a
    CUDA IPC descriptor (under the export lease `lease + 1`), any other as a block of host
    shared memory (under `lease`)."""
    ((inst, ex),) = h.executing(model)
    (req,) = ex.requests
    ok = {o.name: o.device_ok for o in req.outputs}
    h.answer(inst, ex, {n: P.Device(b"h" * 64, 0, 64, 8, lease + 1) if ok[n] else P.Block("/s", 64, 8, lease)
                        for n in outputs})
    return req


def ident(h: Harness, model: str) -> bytes:
    (inst,) = h.instances(model)
    return inst.identity


def infer(h: Harness, *outputs: P.OutputSpec) -> int:
    rid = next(h.rids)
    h.from_frontend(P.Infer(rid, "chain", -1, [P.TensorDesc("IN", "FP32", [2], P.Inline(b"\0" * 8))], list(outputs)))
    return rid


def test_device_ok_only_on_intermediates_that_gpu_steps_read(chain):
    h = chain
    rid = infer(h)
    a = answer(h, "gpu_a", 11, Y=True, Z=True)
    # t1 feeds only gpu_b; MID is also an ensemble output, so it stays on the host.
    assert {o.name: o.device_ok for o in a.outputs} == {"Y": True, "Z": False}
    bb = answer(h, "gpu_b", 21, Y=True)
    x, w = sorted(bb.inputs, key=lambda d: d.name != "X")
    assert (x.name, x.loc) == ("X", P.Device(b"h" * 64, 0, 64, 8))   # passed on, without the lease
    assert (w.name, w.loc) == ("W", P.Block("/s", 64, 8))
    assert [o.device_ok for o in bb.outputs] == [False]              # t2 is read by a CPU step
    c = answer(h, "cpu_c", 31, Y=True)
    assert [o.device_ok for o in c.outputs] == [False]               # an ensemble output
    reply = h.replies()[rid]
    assert reply.error is None and not any(isinstance(d.loc, P.Device) for d in reply.outputs)
    assert h.released() == sorted([(ident(h, "gpu_a"), 12), (ident(h, "gpu_b"), 21)])   # once each
    assert reply.owner.startswith(b"ensemble:")
    assert sorted(h.broker.ensembles.handovers[reply.owner].values()) == sorted(
        [(ident(h, "gpu_a"), 11), (ident(h, "cpu_c"), 31)])


def test_a_failed_request_releases_device_intermediates_too(chain):
    h = chain
    rid = infer(h, P.OutputSpec("OUT"))
    a = answer(h, "gpu_a", 11, Y=True, Z=True)
    assert all(o.device_ok for o in a.outputs)                  # MID is not asked for: gpu_b alone reads it
    ((inst, ex),) = h.executing("gpu_b")
    assert all(isinstance(d.loc, P.Device) for d in ex.requests[0].inputs)
    h.answer(inst, ex, P.ExecResult(error=internal("broke")))
    assert "broke" in h.replies()[rid].error.message
    assert h.released() == [(ident(h, "gpu_a"), 12)]


def test_an_enclosing_ensemble_that_takes_device_memory_gets_it(chain):
    h = chain
    (mv,) = h.broker.registry.get("chain").values()
    h.broker.ensembles.run(lambda reply: None, P.Infer(
        99, "chain", -1, [P.TensorDesc("IN", "FP32", [2], P.Inline(b"\0" * 8))],
        [P.OutputSpec("MID", device_ok=True)]), mv)
    a = answer(h, "gpu_a", 11, Z=True)
    assert [(o.name, o.device_ok) for o in a.outputs] == [("Z", True)]


def test_a_frontend_cannot_ask_for_device_memory(chain):
    h = chain
    infer(h, P.OutputSpec("MID", device_ok=True))
    a = answer(h, "gpu_a", 11, Z=True)
    assert [(o.name, o.device_ok) for o in a.outputs] == [("Z", False)]


def test_frontends_never_ask_for_device_memory():
    """The dataplane builds every request a frontend sends; none lets a worker answer with a
    CUDA IPC descriptor, so clients always get host bytes (or their own regions)."""
    sent: list[P.Infer] = []

    class Client:
        def next_id(self, model: str = "") -> int:
            return 1

        async def infer(self, msg, on_orphan=None):
            sent.append(msg)
            return P.InferReply(msg.rid, 1, [P.TensorDesc("SUM", "FP32", [1, 4], P.Inline(b"\0" * 16))])

    config = {
        "max_batch_size": 8, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [4]},
                   {"name": "DIFF", "data_type": "TYPE_FP32", "dims": [4]}]}
    entry = P.ModelEntry("add", 1, P.ModelState.READY, view=model_view(config), config=config)
    dp = Dataplane(Client(), None, None)
    inputs = [InputTensor("A", "FP32", [1, 4], b"\0" * 16)]
    outputs = [OutputRequest("SUM"), OutputRequest("DIFF")]
    result = asyncio.run(dp.infer(entry, inputs, outputs, RequestOptions()))
    (msg,) = sent
    assert [o.device_ok for o in msg.outputs] == [False, False]
    assert result.outputs[0].data == b"\0" * 16
