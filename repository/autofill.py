"""Triton's core autofill: name, backend, platform and model file from what is on disk.

It runs even with auto-complete disabled (as in Triton), so a model directory with
just `1/model.onnx` or `1/model.py` needs no config.pbtxt to be identified.
"""
from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2

from .backends import (
    BACKEND_PLATFORM,
    DEFAULT_MODEL_FILENAME,
    DETECTION_ORDER,
    ENSEMBLE_PLATFORM,
    FILENAME_BACKEND,
    PLATFORM_BACKEND,
    PYTHON_RUNTIME,
    PYTORCH,
)
from .errors import ConfigError


def _detect(version_path: str) -> tuple[str, str, str]:
    """(backend, platform, filename) of the first known model file in a version directory."""
    for filename, backend, platform, want_dir in DETECTION_ORDER:
        path = os.path.join(version_path, filename)
        if not os.path.exists(path):
            continue
        if want_dir is None or os.path.isdir(path) == want_dir:
            return backend, platform, filename
    return "", "", ""


def autofill_backend(
    cfg: model_config_pb2.ModelConfig, model_name: str, first_version_path: str | None, config_file: str
) -> None:
    """Fill `backend`, `platform` and `default_model_filename` where the config leaves them empty.

    Raises ConfigError when nothing identifies the backend and the model name is
    not of the form `model.<backend>`.
    """
    if cfg.platform == ENSEMBLE_PLATFORM:
        return
    if not cfg.backend:
        # Triton tries the platform, then the model file name, of each backend in turn: a platform
        # it does not know still gets the backend its default_model_filename names
        cfg.backend = (PLATFORM_BACKEND.get(cfg.platform, "")
                       or FILENAME_BACKEND.get(cfg.default_model_filename, ""))
        if not (cfg.backend or cfg.platform or cfg.default_model_filename) and first_version_path is not None:
            backend, platform, filename = _detect(first_version_path)
            cfg.backend, cfg.platform, cfg.default_model_filename = backend, platform, filename
            if backend == PYTORCH:      # Triton leaves the file name unset when it found model.pt
                cfg.default_model_filename = ""
                return
    if not cfg.platform and cfg.backend in BACKEND_PLATFORM:
        cfg.platform = BACKEND_PLATFORM[cfg.backend]
    # a Python-based runtime reads the model's files itself: Triton names no model file for it
    if not cfg.default_model_filename and cfg.backend in DEFAULT_MODEL_FILENAME and cfg.runtime != PYTHON_RUNTIME:
        cfg.default_model_filename = DEFAULT_MODEL_FILENAME[cfg.backend]
    if cfg.backend or cfg.platform or cfg.default_model_filename:
        return
    if "." not in model_name:
        raise ConfigError(
            model_name,
            config_file,
            "backend",
            f"Invalid model name: Could not determine backend for model '{model_name}' with no backend "
            "in model configuration. Expected model name of the form 'model.<backend_name>'.",
        )
    cfg.backend = model_name.split(".", 1)[1]
    cfg.default_model_filename = f"model.{cfg.backend}"
