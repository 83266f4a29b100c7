"""The parsed view of a model config that the broker ships with each model-table entry, so no
process re-reads raw config JSON on a request's path."""
from __future__ import annotations

import os
from typing import Any

from tritond.wire.schema import (
    DynamicBatching, ModelView, QueuePolicy, SequenceBatching, SequenceControl, TensorView,
)

from .backends import runner
from .datatypes import CONFIG_TO_WIRE
from .idempotent import idempotent
from .normalize import SEQUENCE_IDLE_DEFAULT_US
from .parameters import config_parameter

DEFAULT_EXEC_TIMEOUT_S = 60.0


def read_labels(model_dir: str, label_filename: str) -> list[str]:
    """An output's labels, one per line of `<model dir>/<label_filename>` (Triton reads them
    once when the model loads; classification results append them as `value:index:label`)."""
    try:
        with open(os.path.join(model_dir, label_filename), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:         # removed since validation read it: no labels rather than a broker crash
        return []
    if lines and not lines[-1]:
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _tensor(t: dict[str, Any], model_dir: str = "") -> TensorView:
    label_file = t.get("label_filename") or ""
    return TensorView(
        name=t["name"],
        datatype=CONFIG_TO_WIRE.get(t.get("data_type", ""), ""),
        dims=[int(d) for d in t.get("dims") or []],
        optional=bool(t.get("optional", False)),
        shape_tensor=bool(t.get("is_shape_tensor", False)),
        ragged=bool(t.get("allow_ragged_batch", False)),
        labels=read_labels(model_dir, label_file) if label_file and model_dir else [],
    )


def _queue_policy(d: dict[str, Any] | None) -> QueuePolicy:
    d = d or {}
    return QueuePolicy(
        timeout_action=str(d.get("timeout_action", "REJECT")),
        default_timeout_us=int(d.get("default_timeout_microseconds", 0) or 0),
        allow_timeout_override=bool(d.get("allow_timeout_override", False)),
        max_queue_size=int(d.get("max_queue_size", 0) or 0),
    )


def _dynamic_batching(db: dict[str, Any] | None) -> DynamicBatching | None:
    if db is None:
        return None
    return DynamicBatching(
        preferred=sorted({int(x) for x in db.get("preferred_batch_size") or []}),
        max_delay_us=int(db.get("max_queue_delay_microseconds", 0) or 0),
        preserve_ordering=bool(db.get("preserve_ordering", False)),
        priority_levels=int(db.get("priority_levels", 0) or 0),
        default_level=int(db.get("default_priority_level", 0) or 0),
        default_policy=_queue_policy(db.get("default_queue_policy")),
        level_policies={int(k): _queue_policy(v) for k, v in (db.get("priority_queue_policy") or {}).items()},
    )


_CONTROL_KINDS = {"CONTROL_SEQUENCE_START": "START", "CONTROL_SEQUENCE_END": "END",
                  "CONTROL_SEQUENCE_READY": "READY", "CONTROL_SEQUENCE_CORRID": "CORRID"}


def _control(name: str, c: dict[str, Any]) -> SequenceControl:
    """A control input with its false/true values (boolean kinds) or its datatype (CORRID)."""
    for key, datatype in (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"), ("bool_false_true", "BOOL")):
        values = c.get(key)
        if values:
            return SequenceControl(name, datatype, float(values[0]), float(values[1]))
    return SequenceControl(name, CONFIG_TO_WIRE.get(c.get("data_type", ""), ""))


def _sequence_batching(seq: dict[str, Any] | None) -> SequenceBatching | None:
    if seq is None:
        return None
    controls = {}
    for ci in seq.get("control_input") or []:
        for c in ci.get("control") or []:
            kind = _CONTROL_KINDS.get(str(c.get("kind", "CONTROL_SEQUENCE_START")))
            if kind:
                controls[kind] = _control(ci["name"], c)
    oldest = seq.get("oldest")
    strategy = oldest if oldest is not None else (seq.get("direct") or {})
    return SequenceBatching(
        oldest=oldest is not None,
        max_idle_us=int(seq.get("max_sequence_idle_microseconds", 0) or 0) or SEQUENCE_IDLE_DEFAULT_US,
        max_delay_us=int(strategy.get("max_queue_delay_microseconds", 0) or 0),
        min_slot_utilization=float(strategy.get("minimum_slot_utilization", 0.0) or 0.0),
        max_candidates=int(strategy.get("max_candidate_sequences", 0) or 0),
        preferred=sorted({int(x) for x in strategy.get("preferred_batch_size") or []}),
        preserve_ordering=bool(strategy.get("preserve_ordering", False)),
        controls=controls,
        states=[s["input_name"] for s in seq.get("state") or []],
        iterative=bool(seq.get("iterative_sequence", False)),
    )


def _exec_timeout(config: dict[str, Any]) -> float:
    raw = config_parameter(config, "execution_timeout_seconds")
    try:
        return float(raw) if raw else DEFAULT_EXEC_TIMEOUT_S
    except ValueError:
        return DEFAULT_EXEC_TIMEOUT_S


def model_view(config: dict[str, Any], model_dir: str = "") -> ModelView:
    """The view of a config JSON dict (as GET /config renders it); with `model_dir`, outputs
    carry the labels of their `label_filename` (validation made sure the file is readable). Its
    backend is the one whose workers run the model (python for a Python-based backend)."""
    platform = str(config.get("platform", ""))
    return ModelView(
        max_batch_size=int(config.get("max_batch_size", 0) or 0),
        platform=platform,
        backend=runner(str(config.get("backend", "")), str(config.get("runtime", ""))),
        ensemble=platform == "ensemble",
        decoupled=bool((config.get("model_transaction_policy") or {}).get("decoupled", False)),
        inputs={t["name"]: _tensor(t) for t in config.get("input") or []},
        outputs={t["name"]: _tensor(t, model_dir) for t in config.get("output") or []},
        batching=_dynamic_batching(config.get("dynamic_batching")),
        exec_timeout_s=_exec_timeout(config),
        idempotent=idempotent(config),
        response_cache=bool((config.get("response_cache") or {}).get("enable", False)),
        sequence=_sequence_batching(config.get("sequence_batching")),
    )
