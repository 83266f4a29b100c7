"""Backends by name, as the registry (repository/backends.py) lists them; each backend's module
is imported only when a worker needs it."""
from __future__ import annotations

import importlib

from tritond.repository.backends import record_for
from tritond.wire.schema import ModelView

from .base import Backend, InstanceInfo


def create(config: dict, view: ModelView, instance: InstanceInfo) -> Backend:
    """The backend instance that executes this model (`view` is the worker's parse of `config`)."""
    record = record_for(view.backend, view.platform)
    if record is None:
        raise ValueError(f"unsupported backend '{view.backend or view.platform}'")
    cls = getattr(importlib.import_module(record.worker_module), record.worker_class)
    return cls(config, view, instance)
