"""Warnings for configs that work but leave throughput on the table.

The common miss: a model that accepts any batch size is served one request at
a time because the config never turned batching on.
"""
from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from .backends import ENSEMBLE_PLATFORM
from .parameters import parameter_text

# A model served one request at a time on purpose (a baseline, a demonstration of a
# non-batching shape) says so with this parameter, and is not advised.
SILENCE = "batching_advice"


def config_advice(cfg: model_config_pb2.ModelConfig) -> list[str]:
    """Warnings naming the fix; none for ensembles, sequence-batched models, or models whose
    config sets `batching_advice` to `off`."""
    if cfg.platform == ENSEMBLE_PLATFORM or cfg.HasField("sequence_batching"):
        return []
    setting = parameter_text(cfg, SILENCE).strip().lower()
    if setting == "off":
        return []
    if SILENCE in cfg.parameters and setting != "on":
        return [f"model '{cfg.name}': parameter '{SILENCE}' must be 'on' or 'off', got "
                f"'{parameter_text(cfg, SILENCE)}'; the advice stays on"] + _batching(cfg)
    return _batching(cfg)


def _batching(cfg: model_config_pb2.ModelConfig) -> list[str]:
    if cfg.max_batch_size == 0:
        variable = [io.name for io in cfg.input if io.dims and io.dims[0] == -1]
        if not variable:
            return []
        names = ", ".join(f"'{n}'" for n in variable)
        subject = f"input {names} has" if len(variable) == 1 else f"inputs {names} have"
        return [
            f"model '{cfg.name}': {subject} a variable first dimension but max_batch_size is 0; "
            "set max_batch_size > 0 and add `dynamic_batching { }` to let the server batch requests"
        ]
    if cfg.max_batch_size > 1 and not cfg.HasField("dynamic_batching"):
        return [
            f"model '{cfg.name}': max_batch_size is {cfg.max_batch_size} but there is no dynamic_batching, "
            "so each request runs alone; add `dynamic_batching { }` to let the server batch requests"
        ]
    return []
