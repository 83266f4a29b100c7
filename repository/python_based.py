"""Python-based backends, as Triton finds them: a backend that is not built in, whose directory
under the backend directory holds a model.py, runs on the Python backend with that model.py for
every model naming it (vLLM's backend is one). Triton records this as the config's runtime
"model.py", which a config may also set itself to run a backend's Python runtime."""
from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2

from tritond.wire.options import DEFAULT_BACKEND_DIRECTORY

from .backends import ENSEMBLE_PLATFORM, KNOWN_BACKENDS, PYTHON_RUNTIME

__all__ = ["DEFAULT_BACKEND_DIRECTORY", "resolve_runtime", "runtime_dir", "runtime_model_file"]


def runtime_dir(backend_directory: str, backend: str) -> str:
    """The directory whose model.py runs a Python-based backend's models."""
    return os.path.join(backend_directory, backend)


def resolve_runtime(cfg: model_config_pb2.ModelConfig, backend_directory: str) -> None:
    """Set `runtime` to model.py for a backend tritond does not build in whose directory holds
    one (Triton looks for a backend library first, then for model.py)."""
    if (cfg.runtime or not cfg.backend or cfg.backend in KNOWN_BACKENDS or cfg.platform == ENSEMBLE_PLATFORM
            or not backend_directory):
        return
    if os.path.isfile(os.path.join(runtime_dir(backend_directory, cfg.backend), PYTHON_RUNTIME)):
        cfg.runtime = PYTHON_RUNTIME


def runtime_model_file(cfg: model_config_pb2.ModelConfig, backend_directory: str) -> str:
    """The model.py a Python-based backend runs its model with."""
    return os.path.join(runtime_dir(backend_directory, cfg.backend), PYTHON_RUNTIME)
