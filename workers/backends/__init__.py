"""Backends by name; each is imported only when a worker needs it."""
from __future__ import annotations

from .base import Backend, InstanceInfo


def create(config: dict, instance: InstanceInfo) -> Backend:
    backend = config.get("backend") or ""
    platform = config.get("platform") or ""
    if backend == "onnxruntime" or platform == "onnxruntime_onnx":
        from .onnxruntime import OnnxBackend
        return OnnxBackend(config, instance)
    if backend == "python":
        from .python import PythonBackend
        return PythonBackend(config, instance)
    if backend == "pytorch" or platform == "pytorch_libtorch":
        from .pytorch import TorchBackend
        return TorchBackend(config, instance)
    if backend == "tensorrt" or platform == "tensorrt_plan":
        from .tensorrt import TensorRTBackend
        return TensorRTBackend(config, instance)
    if backend == "openvino":
        from .openvino import OpenVINOBackend
        return OpenVINOBackend(config, instance)
    if backend == "identity":
        from .identity import IdentityBackend
        return IdentityBackend(config, instance)
    if platform == "tensorflow_savedmodel":
        from .tensorflow import TensorFlowBackend
        return TensorFlowBackend(config, instance)
    raise ValueError(f"unsupported backend '{backend or platform}'")
