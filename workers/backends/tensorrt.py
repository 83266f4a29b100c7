"""TensorRT backend: a serialized engine (`model.plan`) run on the instance's GPU.

The engine is deserialized with the `tensorrt` Python API (TensorRT 10's named-tensor
interface), inputs and outputs are bound by name, each batch runs on the instance's own
CUDA stream, and the optimization profile is chosen per batch from the input shapes.
Device buffers come from cuda-python and are kept per tensor, grown only when a larger
batch arrives, so steady traffic allocates nothing.

`tensorrt` and `cuda.bindings` are imported only when a TensorRT model loads. What can be
checked without them (config data types, instance kind) is checked first, and a missing
library fails the model with a reason that says what to install.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tritond.repository.backends import TENSORRT

from ..gpu_env import check_mps_share
from .base import Backend, WorkerRequest, WorkerResponse
from .batching import execute_batch

# Config data types a TensorRT engine can bind (TensorRT has no 16-bit-plus unsigned,
# INT16, FP64 or string tensors).
SUPPORTED_TYPES = ("TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT32", "TYPE_INT64",
                   "TYPE_FP16", "TYPE_FP32", "TYPE_BF16")


def validate_config(config: dict, model: str) -> None:
    """Reject what no TensorRT engine can serve, before any library is imported."""
    for kind in ("input", "output"):
        for t in config.get(kind) or []:
            dtype = t.get("data_type", "TYPE_INVALID")
            if dtype not in SUPPORTED_TYPES:
                raise ValueError(f"unsupported datatype {dtype} for {kind} '{t.get('name')}' "
                                 f"of TensorRT model '{model}'")


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as e:
        raise RuntimeError("the TensorRT backend needs the 'tensorrt' Python package, which is not "
                           f"installed here (pip install tensorrt; it also needs a GPU): {e}") from None
    return tensorrt


def numpy_dtype(trt: Any, dtype: Any) -> np.dtype:
    """numpy type of a TensorRT tensor type; BF16 travels as its uint16 bits (Triton's BF16 wire format)."""
    if dtype == trt.DataType.BF16:
        return np.dtype(np.uint16)
    return np.dtype(trt.nptype(dtype))


def select_profile(ranges: list[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]],
                   shapes: dict[str, tuple[int, ...]]) -> int:
    """Index of the first optimization profile whose [min, max] range admits every input shape.

    `ranges[i][name]` is profile i's (min, max) shape of input `name`; an input missing from
    a profile's ranges has a static shape and always fits.
    """
    for index, profile in enumerate(ranges):
        fits = True
        for name, shape in shapes.items():
            if name not in profile:
                continue
            lo, hi = profile[name]
            if len(lo) != len(shape) or any(not (a <= s <= b) for a, s, b in zip(lo, shape, hi)):
                fits = False
                break
        if fits:
            return index
    described = ", ".join(f"{n} {list(s)}" for n, s in shapes.items())
    raise ValueError(f"no optimization profile of the engine accepts the input shapes {described}")


class TensorRTBackend(Backend):
    """One engine and execution context per worker, on the worker's GPU."""
    name = TENSORRT

    def load(self) -> None:
        validate_config(self.config, self.instance.model_name)
        trt = import_tensorrt()
        if self.instance.kind != "GPU":
            raise RuntimeError(f"TensorRT engines run only on GPUs: instance '{self.instance.instance_name}' "
                               f"has kind KIND_{self.instance.kind}; use instance_group {{ kind: KIND_GPU }}")
        check_mps_share()
        from tritond.workers.cuda_ipc import check, cuda_runtime
        self.cudart, self.check = cuda_runtime(), check
        cudart = self.cudart
        self.check(cudart.cudaSetDevice(0), "cudaSetDevice")
        self.stream = self.check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreate")
        path = self.model_path()
        with open(path, "rb") as f:
            data = f.read()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            raise RuntimeError(f"unable to deserialize the TensorRT engine in '{path}' (built for another "
                               "TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self.dtypes = {n: numpy_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        for kind, configured, known in (("input", self.view.inputs, self.input_names),
                                        ("output", self.view.outputs, self.output_names)):
            for name in configured:
                if name not in known:
                    raise ValueError(f"unexpected {kind} '{name}' in the configuration of TensorRT model "
                                     f"'{self.instance.model_name}'; the engine has {kind}s {known}")
        self.ranges = []
        for p in range(self.engine.num_optimization_profiles):
            profile = {}
            for n in self.input_names:
                lo, _opt, hi = self.engine.get_tensor_profile_shape(n, p)
                profile[n] = (tuple(lo), tuple(hi))
            self.ranges.append(profile)
        self.profile = -1
        self.buffers: dict[str, tuple[int, int]] = {}      # name -> (device pointer, capacity)
        self.batching = self.view.max_batch_size > 0

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, capacity = self.buffers.get(name, (0, 0))
        if nbytes > capacity:
            if ptr:
                self.check(self.cudart.cudaFree(ptr), "cudaFree")
            ptr = int(self.check(self.cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self.buffers[name] = (ptr, nbytes)
        return ptr

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart, check, ctx = self.cudart, self.check, self.context
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        shapes = {n: tuple(a.shape) for n, a in inputs.items()}
        if self.ranges:
            profile = select_profile(self.ranges, shapes)
            if profile != self.profile:
                ctx.set_optimization_profile_async(profile, int(self.stream))
                self.profile = profile
        keep = []
        for name, arr in inputs.items():
            host = np.ascontiguousarray(arr, dtype=self.dtypes[name])
            keep.append(host)
            ptr = self._buffer(name, host.nbytes)
            if not ctx.set_input_shape(name, host.shape):
                raise ValueError(f"input '{name}' shape {list(host.shape)} is outside the engine's profile")
            ctx.set_tensor_address(name, ptr)
            check(cudart.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, h2d, self.stream), "cudaMemcpyAsync")
        outputs = {}
        for name in self.output_names:
            out = np.empty(tuple(ctx.get_tensor_shape(name)), dtype=self.dtypes[name])
            ctx.set_tensor_address(name, self._buffer(name, out.nbytes))
            outputs[name] = out
        if not ctx.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execution failed")
        for name, out in outputs.items():
            check(cudart.cudaMemcpyAsync(out.ctypes.data, self.buffers[name][0], out.nbytes, d2h, self.stream),
                  "cudaMemcpyAsync")
        check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return outputs

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return execute_batch(requests, self._run, self.batching)

    def close(self) -> None:
        cudart = getattr(self, "cudart", None)
        if cudart is None:
            return
        for ptr, _ in self.buffers.values():
            cudart.cudaFree(ptr)
        self.buffers = {}
        cudart.cudaStreamDestroy(self.stream)
