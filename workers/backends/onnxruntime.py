"""ONNX Runtime backend: one InferenceSession per worker; requests of a batch are
concatenated once along the batch dimension and the outputs split back as views."""
from __future__ import annotations

import numpy as np

from tritond.repository.backends import ONNXRUNTIME

from ..gpu_env import check_mps_share
from .base import Backend, WorkerRequest, WorkerResponse
from .batching import Reshapes, execute_batch
from .ragged import RaggedPlan


class OnnxBackend(Backend):
    name = ONNXRUNTIME

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
        self.session = ort.InferenceSession(path, sess_options=opts, providers=providers)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.reshapes = Reshapes(self.view, self.config)
        self.batching = self.reshapes.batching
        self.ragged = RaggedPlan.from_config(self.view, self.config)

    def _feed(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {}
        for name, arr in self.reshapes.model_inputs(inputs).items():
            if arr.dtype == np.object_:
                arr = np.array([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                                for x in arr.reshape(-1)], dtype=object).reshape(arr.shape)
            feed[name] = arr
        return feed

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        return execute_batch(requests, self._run, self.batching, ragged=self.ragged)

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self.output_names, self._feed(inputs))
        outputs = self.reshapes.client_outputs(dict(zip(self.output_names, results)))
        for name, arr in outputs.items():
            if arr.dtype.kind == "U" or arr.dtype == np.object_:
                outputs[name] = np.array([str(x).encode() for x in arr.reshape(-1)], dtype=object).reshape(arr.shape)
        return outputs
