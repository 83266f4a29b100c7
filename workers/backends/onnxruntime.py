"""ONNX Runtime backend: one InferenceSession per worker; requests of a batch are
concatenated once along the batch dimension and the outputs split back as views. A request
executed alone whose outputs go to a client's shared-memory region has ONNX Runtime write them
there (output binding), when the model's output shapes are known before it runs: fixed dims,
or named dims (dim_param) that an input has too, read from that input's shape."""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tritond.repository.backends import ONNXRUNTIME

from ..gpu_env import check_mps_share
from .base import Backend, WorkerRequest, WorkerResponse
from .batching import Reshapes, execute_batch
from .onnxruntime_options import OPENVINO, OrtSettings, ort_settings
from .ragged import RaggedPlan


log = logging.getLogger("tritond.worker")

# ONNX Runtime's element types that numpy holds as they are (strings and bfloat16 are not bound).
_ORT_DTYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def _configure(ort: Any, opts: Any, settings: OrtSettings) -> Any:
    """Apply `settings` to the session options; the RunOptions every run takes (None: defaults)."""
    for line in settings.log_lines:
        log.debug("%s", line)
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings.graph_level)
    if settings.parallel:
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    for key, value in settings.session_entries:
        opts.add_session_config_entry(key, value)
    if settings.mem_arena is not None:
        opts.enable_cpu_mem_arena = settings.mem_arena
    if settings.mem_pattern is not None:
        opts.enable_mem_pattern = settings.mem_pattern
    if not settings.run_entries:
        return None
    run = ort.RunOptions()
    for key, value in settings.run_entries:
        run.add_run_config_entry(key, value)
    return run


class OnnxBackend(Backend):
    name = ONNXRUNTIME
    writes_into_regions = True

    def load(self) -> None:
        import onnxruntime as ort

        path = self.model_path()
        opts = ort.SessionOptions()
        # The instance's thread budget (intra_op_thread_count / inter_op_thread_count or its share
        # of the host's cores, decided at load); one thread when not budgeted (a GPU instance).
        opts.intra_op_num_threads = self.instance.threads or 1
        if self.instance.inter_op_threads:
            opts.inter_op_num_threads = self.instance.inter_op_threads
        opts.log_severity_level = 3
        settings = ort_settings(self.config, self.instance.model_name)
        self.run_options = _configure(ort, opts, settings)
        if self.instance.kind == "GPU":
            check_mps_share()
            available = ort.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise RuntimeError("KIND_GPU instance requested but no CUDA execution provider is available "
                                   "(no GPU on this machine or onnxruntime-gpu cannot load CUDA)")
            providers = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
            accelerators = ((self.config.get("optimization") or {}).get("execution_accelerators") or {})
            if any(a.get("name") == "tensorrt" for a in accelerators.get("gpu_execution_accelerator", [])):
                providers.insert(0, "TensorrtExecutionProvider")
        else:
            providers = ["CPUExecutionProvider"]
            if OPENVINO in settings.cpu_accelerators:
                if "OpenVINOExecutionProvider" not in ort.get_available_providers():
                    raise RuntimeError("the 'openvino' CPU execution accelerator needs onnxruntime's "
                                       "OpenVINOExecutionProvider, which this onnxruntime does not have")
                providers.insert(0, "OpenVINOExecutionProvider")
                log.debug("OpenVINO Execution Accelerator is set for '%s' on CPU", self.instance.model_name)
        self.session = ort.InferenceSession(path, sess_options=opts, providers=providers)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.reshapes = Reshapes(self.view, self.config)
        self.batching = self.reshapes.batching
        self.ragged = RaggedPlan.from_config(self.view, self.config)
        self.bindable = {} if self.ragged is not None or self.instance.kind == "GPU" else self._bindable()

    def _bindable(self) -> dict[str, tuple[np.dtype, list[int | tuple[str, int]]]]:
        """Outputs whose dims (behind the batch dimension of a batching model) are known before
        a run, so they can be bound to a client's region: each dim fixed, or named as a dim of
        an input is named (ONNX gives one name one size), given as (that input, its axis)."""
        named: dict[str, tuple[str, int]] = {}
        for i in self.session.get_inputs():
            for axis, d in enumerate(i.shape or []):
                if type(d) is str and d:
                    named.setdefault(d, (i.name, axis))
        out = {}
        for o in self.session.get_outputs():
            dtype = _ORT_DTYPES.get(o.type)
            shape = list(o.shape or [])
            if self.batching:
                if not shape or type(shape[0]) is int:      # no free batch dimension to fill in
                    continue
                shape = shape[1:]
            dims = [d if type(d) is int and d >= 0 else named.get(d) if type(d) is str else None for d in shape]
            if dtype is not None and None not in dims:
                out[o.name] = (np.dtype(dtype), dims)
        return out

    def _feed(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {}
        for name, arr in self.reshapes.model_inputs(inputs).items():
            if arr.dtype == np.object_:
                arr = np.array([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                                for x in arr.reshape(-1)], dtype=object).reshape(arr.shape)
            feed[name] = arr
        return feed

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        if len(requests) == 1 and requests[0].output_buffers and self.bindable:
            outputs = self._run_into(requests[0])
            if outputs is not None:
                wanted = requests[0].requested_outputs
                return [WorkerResponse({k: v for k, v in outputs.items() if not wanted or k in wanted})]
        return execute_batch(requests, self._run, self.batching, ragged=self.ragged)

    def _run_into(self, req: WorkerRequest) -> dict[str, np.ndarray] | None:
        """Run with the outputs that go to client regions bound there (the rest ONNX Runtime
        allocates); None when none can be bound: a string input, a region too small, or one
        that overlaps an input (the model would overwrite what it still reads)."""
        feed = self._feed(req.inputs)
        if any(a.dtype == np.object_ or not a.flags.c_contiguous for a in feed.values()):
            return None
        batch = [next(iter(feed.values())).shape[0]] if self.batching and feed else []
        bound: dict[str, np.ndarray] = {}
        for name, buf in req.output_buffers.items():
            spec = self.bindable.get(name)
            if spec is None:
                continue
            dtype, dims = spec
            try:
                shape = batch + [d if type(d) is int else feed[d[0]].shape[d[1]] for d in dims]
            except (KeyError, IndexError):      # an optional input left out, or of fewer dims
                continue
            count = int(np.prod(shape, dtype=np.int64))
            if count == 0 or count * dtype.itemsize > len(buf):
                continue
            arr = np.frombuffer(buf, dtype, count).reshape(shape)
            if not any(np.may_share_memory(arr, a) for a in feed.values()):
                bound[name] = arr
        if not bound:
            return None
        binding = self.session.io_binding()
        for name, arr in feed.items():
            binding.bind_cpu_input(name, arr)
        for name in self.output_names:
            arr = bound.get(name)
            if arr is None:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        try:
            self.session.run_with_iobinding(binding, self.run_options)
        except Exception:       # the graph's output shape was not what it declares: run as usual
            return None
        values = binding.get_outputs()
        results = {name: bound[name] if name in bound else value.numpy()
                   for name, value in zip(self.output_names, values)}
        return self._client_outputs(results)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self.output_names, self._feed(inputs), self.run_options)
        return self._client_outputs(dict(zip(self.output_names, results)))

    def _client_outputs(self, results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.reshapes.client_outputs(results)
        for name, arr in outputs.items():
            if arr.dtype.kind == "U" or arr.dtype == np.object_:
                outputs[name] = np.array([str(x).encode() for x in arr.reshape(-1)], dtype=object).reshape(arr.shape)
        return outputs
