"""The contract between the worker loop and a framework backend.

A backend sees numpy arrays and returns numpy arrays; it never touches sockets or
shared memory. The worker loop builds the arrays (views on shared memory) and writes
the outputs back, so every backend gets zero-copy inputs for free. A GPU backend may also
return device arrays and, with `accepts_device_inputs`, take them (see workers/cuda_ipc.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritond.repository.backends import backend_record
from tritond.wire.errors import TritonError
from tritond.wire.schema import ModelView


@dataclass
class InstanceInfo:
    """Where this backend instance runs and what it serves."""
    model_name: str
    model_version: int
    model_dir: str          # <repo>/<model>
    version_dir: str        # <repo>/<model>/<version>
    instance_name: str      # e.g. "<model>_0_0"
    kind: str = "CPU"       # CPU | GPU | MODEL
    device_id: int = 0
    model_repository: str = ""
    index: int = 0          # this instance's place among the model's instances (creation order)
    # Its thread budget (decided by the broker at load): intra-op / BLAS pools, inter-op pools;
    # 0: not budgeted, the backend's own defaults.
    threads: int = 0
    inter_op_threads: int = 0
    runtime_dir: str = ""   # a Python-based backend's directory, whose model.py runs the model


@dataclass(slots=True)
class WorkerRequest:
    """One inference request inside a batch, as the backend sees it."""
    inputs: dict[str, np.ndarray]          # BYTES tensors are numpy object arrays of bytes
    requested_outputs: list[str]           # empty: every output of the model
    request_id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    # Sends a decoupled model's responses and says whether the request was cancelled
    # (workers/responses.py); None outside a worker.
    responder: Any = None
    # Writable views of the client's system shared-memory regions its outputs go to, by
    # output name, for a backend that `writes_into_regions`; None otherwise.
    output_buffers: dict[str, memoryview] | None = None
    # This request's trace when it is traced (tritond.wire.schema.TraceRef): BLS calls made
    # with request.trace() are traced as its children.
    trace: Any = None


@dataclass(slots=True)
class WorkerResponse:
    """Outputs for one request, or the error the client gets for it; the response's own
    parameters (a Python model's InferenceResponse may set them)."""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: TritonError | None = None
    parameters: dict[str, int | str | bool] | None = None


class Backend:
    """Base class: load once, execute batches, close on exit."""

    name: str = ""      # its record in the registry (repository/backends.py)

    # True when execute() takes inputs in device memory (a DeviceArray opened by CUDA IPC
    # handle, exposing __cuda_array_interface__); otherwise the worker copies them to the host.
    accepts_device_inputs: bool = False

    # True when execute() may compute an output straight into its `output_buffers` entry (the
    # worker then has nothing left to copy there); decided per backend, so the worker looks
    # the regions up only for such backends.
    writes_into_regions: bool = False

    # After execute(): the requests (indices into its list) an iterative sequence model released
    # to run again (a Python model's set_release_flags(RESCHEDULE)); no answer goes for them yet.
    rescheduled: tuple[int, ...] = ()

    def __init__(self, config: dict, view: ModelView, instance: InstanceInfo) -> None:
        self.view = view              # the parsed config: batching, tensors, decoupling
        self.config = config          # Triton config JSON, for what the view does not carry
        self.instance = instance

    def model_path(self) -> str:
        """This version's model file: the config's default_model_filename, else the registry's."""
        filename = self.config.get("default_model_filename") or backend_record(self.name).model_file
        return os.path.join(self.instance.version_dir, filename)

    def auto_complete(self) -> dict | None:
        """Return a completed config dict when this backend fills in config (python), else None."""
        return None

    def load(self) -> None:
        raise NotImplementedError

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        """One response per request, same order. Raising fails the whole batch. A decoupled
        model answers through each request's `responder` instead and returns nothing."""
        raise NotImplementedError

    def ready_hook(self) -> bool:
        """Whether the model says itself when it is ready (a Python model's is_ready())."""
        return False

    def is_ready(self) -> tuple[bool, str]:
        """(ready, why not) by the model's own check; asked only when ready_hook()."""
        return True, ""

    def close(self) -> None:
        """Release framework resources (python: calls finalize())."""
