"""The `idempotent` config parameter: the model's executions may run again.

A model that sets it to true says an execution has no effect outside its answer, so when the
worker running a batch dies the broker runs the batch's requests once more on another instance
instead of failing them. Off by default: a model that writes somewhere or calls out must never
run twice unless its author says so. A sequence-batched model (its state lives in the dead
worker), a decoupled one (responses it sent cannot be taken back) and an ensemble (its steps
follow their own models' settings) cannot set it; their load fails with the reason. Values are
Triton's boolean parameter spellings.
"""
from __future__ import annotations

from typing import Callable

from tritonclient.grpc import model_config_pb2

from .parameters import config_parameter, parameter_text

PARAMETER = "idempotent"
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")


def parse(text: str) -> bool:
    """The parameter's value; raises ValueError naming the accepted spellings."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"parameter '{PARAMETER}' must be true or false, got '{text}'")


def check_idempotent(cfg: model_config_pb2.ModelConfig, fail: Callable[[str, str], Exception]) -> None:
    """Validation: the value parses, and only a model whose executions can repeat sets it."""
    field = f"parameters.{PARAMETER}"
    try:
        on = parse(parameter_text(cfg, PARAMETER))
    except ValueError as e:
        raise fail(field, str(e)) from None
    if not on:
        return
    if cfg.platform == "ensemble":
        raise fail(field, f"an ensemble cannot set '{PARAMETER}': its steps are retried by their own models' "
                          f"'{PARAMETER}' parameter")
    if cfg.HasField("sequence_batching"):
        raise fail(field, f"a sequence-batched model cannot set '{PARAMETER}': its sequences' state is lost "
                          f"with the worker, so a repeated request would not see it")
    if cfg.model_transaction_policy.decoupled:
        raise fail(field, f"a decoupled model cannot set '{PARAMETER}': the responses it already sent "
                          f"cannot be taken back")


def idempotent(config: dict) -> bool:
    """The parameter of a validated config dict (as GET /config renders it)."""
    return parse(config_parameter(config, PARAMETER))
