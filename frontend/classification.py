"""Triton's classification extension: an output requested with `classification: N` comes back
as BYTES, the top N "value:index:label" strings of each batch row ("value:index" where the index
has no label). Labels are the lines of the output's `label_filename`, read once when the model
loaded; an ensemble output without a file of its own takes the labels of the composing model's
output that produces it, through nested ensembles."""
from __future__ import annotations

from typing import Callable

import numpy as np

from tritond.repository.datatypes import serialize_bytes
from tritond.wire import schema as S
from tritond.wire.errors import TritonError, invalid

MAX_NESTING = 16
MAX_ELEMENTS = 1_000_000        # per batch row, as Triton bounds the work of one classification
Resolve = Callable[[str, int], S.ModelEntry]


def output_labels(resolve: Resolve, entry: S.ModelEntry, name: str, depth: int = 0) -> list[str]:
    """The labels of output `name` of `entry`, following an ensemble to the step producing it
    (`resolve` gives the entry serving a model name and version, as the model table does)."""
    view = entry.view
    tensor = view.outputs.get(name) if view is not None else None
    if tensor is None:
        return []
    if tensor.labels or not view.ensemble or not entry.config or depth >= MAX_NESTING:
        return tensor.labels
    for step in (entry.config.get("ensemble_scheduling") or {}).get("step") or []:
        for inner_name, tensor_name in (step.get("output_map") or {}).items():
            if tensor_name == name:
                try:
                    inner = resolve(step["model_name"], int(step.get("model_version", -1)))
                except (TritonError, KeyError, ValueError):
                    return []
                return output_labels(resolve, inner, inner_name, depth + 1)
    return []


def classify(datatype: str, arr: np.ndarray, k: int, batching: bool, labels: list[str]) -> tuple[list[int], bytes]:
    """(shape, serialized BYTES) of the top-`k` classes of an output, per batch row when the
    model batches."""
    if datatype == "BYTES":
        raise invalid(f"class result not available for output due to unsupported type '{datatype}'")
    rows = arr.reshape(arr.shape[0], -1) if batching else arr.reshape(1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise invalid("classification output tensor too large")
    k = min(k, rows.shape[1])
    result = []
    for row in rows:
        idx = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        strings = []
        for j in idx:
            j = int(j)
            label = labels[j] if j < len(labels) else ""
            text = f"{float(row[j]):f}:{j}:{label}" if label else f"{float(row[j]):f}:{j}"
            strings.append(text.encode())
        result.append(strings)
    shape = [rows.shape[0], k] if batching else [k]
    return shape, serialize_bytes(np.array(result, dtype=object))
