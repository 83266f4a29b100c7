"""Which workers are forked from a warm template and which are spawned with their own import."""
import pytest

from tritond.broker.supervision.templates import template_kind
from tritond.wire.schema import WorkerSpec


def spec(config: dict, kind: str = "CPU") -> WorkerSpec:
    return WorkerSpec("s", "ipc://x", "w", 1, "m", 1, "", "", "", config, "m_0", kind)


def param(key: str, value: str) -> dict:
    return {"parameters": {key: {"string_value": value}}}


@pytest.mark.parametrize("config, kind", [
    ({"backend": "python"}, "python"),
    ({"backend": "onnxruntime"}, "onnxruntime"),
    ({"platform": "onnxruntime_onnx"}, "onnxruntime"),
    ({"platform": "pytorch_libtorch"}, "pytorch"),
    ({"backend": "pytorch"}, "pytorch"),
])
def test_cpu_workers_of_these_backends_are_forked(config, kind):
    assert template_kind(spec(config)) == kind


@pytest.mark.parametrize("config, instance", [
    ({"backend": "python"}, "GPU"),                                   # no inherited CUDA context
    ({"backend": "openvino"}, "CPU"),                                 # its import starts a Python thread
    ({"platform": "tensorflow_savedmodel"}, "CPU"),
    ({"backend": "tensorrt"}, "CPU"),
    ({"backend": "python", **param("EXECUTION_ENV_PATH", "/envs/x.tar.gz")}, "CPU"),
    ({"backend": "onnxruntime", **param("memory_limit_bytes", "1000000")}, "CPU"),   # would count the template
])
def test_these_are_spawned(config, instance):
    assert template_kind(spec(config, instance)) is None
