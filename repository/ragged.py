"""Ragged batching in a model config: Triton's checks of `batch_input` and `batch_output`
(core's ValidateBatchIO, with its messages), and which backends tritond runs them on.

The ONNX Runtime and PyTorch workers gather ragged inputs, make batch inputs and scatter batch
outputs (workers/backends/ragged.py). The python and identity backends get each request on
its own, so `allow_ragged_batch` needs nothing from them, but they have no batch inputs or
outputs. Other backends do not do ragged batching in tritond: such a config fails to load.
"""
from __future__ import annotations

from typing import Callable

from tritonclient.grpc import model_config_pb2

from .backends import IDENTITY, ONNXRUNTIME, PYTHON, PYTORCH, runner
from .errors import ConfigError

BatchInput = model_config_pb2.BatchInput
BatchOutput = model_config_pb2.BatchOutput

GATHERING_BACKENDS = (ONNXRUNTIME, PYTORCH)
PER_REQUEST_BACKENDS = (PYTHON, IDENTITY)


def check_ragged(cfg: model_config_pb2.ModelConfig, fail: Callable[[str, str], ConfigError]) -> None:
    """Raise (through `fail(field, message)`) for a batch input or output Triton refuses, or
    ragged batching on a backend tritond does not do it for."""
    inputs = {io.name for io in cfg.input}
    outputs = {io.name for io in cfg.output}
    for i, b in enumerate(cfg.batch_input):
        where = f"batch_input[{i}]"
        kind = BatchInput.Kind.Name(b.kind)
        if len(b.source_input) != 1:
            raise fail(where, f"batch input kind '{kind}' expects 1 source input, got {len(b.source_input)}")
        if b.data_type not in (model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_FP32):
            raise fail(where, "batch input data type must be TYPE_INT32 or TYPE_FP32")
        for name in b.source_input:
            if name not in inputs:
                raise fail(where, f"unknown source input name '{name}'")
    for i, b in enumerate(cfg.batch_output):
        where = f"batch_output[{i}]"
        if len(b.source_input) != 1:
            raise fail(where, f"batch output kind '{BatchOutput.Kind.Name(b.kind)}' expects 1 source input, "
                              f"got {len(b.source_input)}")
        for name in b.source_input:
            if name not in inputs:
                raise fail(where, f"unknown source input name '{name}'")
        seen: set[str] = set()
        for name in b.target_name:
            if name not in outputs:
                raise fail(where, f"unknown target output name '{name}'")
            if name in seen:
                raise fail(where, f"target output name '{name}' can only be specified once")
            seen.add(name)
    ragged = [io.name for io in cfg.input if io.allow_ragged_batch]
    for io in cfg.input:
        if io.allow_ragged_batch and io.optional:
            raise fail("input", f"ragged input '{io.name}' is not supported for optional input")
    batch_io = bool(cfg.batch_input or cfg.batch_output)
    if not (ragged or batch_io):
        return
    backend = runner(cfg.backend, cfg.runtime)
    if backend in GATHERING_BACKENDS or (backend in PER_REQUEST_BACKENDS and not batch_io):
        return
    what = "batch_input/batch_output" if batch_io else "allow_ragged_batch"
    raise fail("batch_input" if batch_io else "input",
               f"'{what}' (ragged batching) is not supported by tritond for the '{cfg.backend}' backend "
               f"(supported: onnxruntime, pytorch; allow_ragged_batch alone also python and identity)")
