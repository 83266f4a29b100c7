"""Model metadata as Triton renders it, derived from the published config JSON."""
from __future__ import annotations

from typing import Any

from tritond.repository.datatypes import CONFIG_TO_WIRE
from tritond.repository.devices import gpu_count
from tritond.wire.options import ServerOptions

SERVER_VERSION = "2.73.0"
# Triton's extensions, in Triton's order.
EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging",
]
SHARED_MEMORY = frozenset({"system_shared_memory", "cuda_shared_memory"})


def server_extensions(opts: ServerOptions) -> list[str]:
    """The extensions this server serves: client shared memory only when allowed, CUDA
    shared memory only where there is a GPU."""
    off: set[str] = set()
    if not opts.allow_client_shm:
        off |= SHARED_MEMORY
    elif gpu_count() == 0:
        off.add("cuda_shared_memory")
    return [e for e in EXTENSIONS if e not in off]


PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}


def platform_of(config: dict[str, Any]) -> str:
    if config.get("platform"):
        return config["platform"]
    backend = config.get("backend", "")
    return PLATFORMS.get(backend, backend)


def tensors(config: dict[str, Any], key: str) -> list[dict[str, Any]]:
    batching = int(config.get("max_batch_size", 0) or 0) > 0
    out = []
    for t in config.get(key, []):
        shape = [int(d) for d in t.get("dims", [])]
        out.append({
            "name": t["name"],
            "datatype": CONFIG_TO_WIRE.get(t.get("data_type", ""), "INVALID"),
            "shape": ([-1] + shape) if batching else shape,
        })
    return out


def model_metadata(config: dict[str, Any], name: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "versions": versions,
        "platform": platform_of(config),
        "inputs": tensors(config, "input"),
        "outputs": tensors(config, "output"),
    }
