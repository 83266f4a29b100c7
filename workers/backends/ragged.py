"""Ragged batching, as Triton's framework backends do it (backend repo's input collector and
output responder): a batch of requests whose ragged inputs differ in shape goes to the model as

- each `allow_ragged_batch` input flattened and concatenated into one 1-D tensor;
- each `batch_input` made from the requests' shapes of its source input: per-request element
  counts (BATCH_ELEMENT_COUNT, shape [requests]), their running sum (..._ACCUMULATED_...),
  the same with a leading 0 (..._WITH_ZERO, [requests + 1]), a tensor shaped [largest count]
  (BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, contents unspecified: zeros here), or each batch item's
  shape without the batch dimension (BATCH_ITEM_SHAPE [items, rank - 1], ..._FLATTEN 1-D);
- other inputs concatenated along the batch dimension as usual.

A `batch_output` (BATCH_SCATTER_WITH_INPUT_SHAPE) is the model's flat output cut back into one
piece per request, shaped as that request's source input (the output's -1 dimensions take the
input's); other outputs are split along the batch dimension.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tritond.wire.schema import ModelView

from .base import WorkerRequest

Concat = Callable[[list[WorkerRequest]], tuple[dict[str, Any], list[int]]]


@dataclass(frozen=True)
class BatchInput:
    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


@dataclass
class RaggedPlan:
    ragged: frozenset[str]
    batch_inputs: list[BatchInput]
    scatter: dict[str, tuple[str, list[int]]]     # output -> (source input, [-1] + output dims)

    @classmethod
    def from_config(cls, view: ModelView, config: dict) -> "RaggedPlan | None":
        """The plan of a batching model that uses ragged batching, else None (`config` gives
        the batch inputs and outputs and the reshapes, which the view does not carry)."""
        if view.max_batch_size <= 0:
            return None
        ragged = frozenset(name for name, t in view.inputs.items() if t.ragged)
        batch_inputs = [
            BatchInput(str(b.get("kind", "BATCH_ELEMENT_COUNT")), tuple(b.get("target_name") or []),
                       np.dtype(np.float32 if b.get("data_type") == "TYPE_FP32" else np.int32),
                       (b.get("source_input") or [""])[0])
            for b in config.get("batch_input") or []
        ]
        outputs = {o["name"]: o for o in config.get("output") or []}
        scatter = {}
        for b in config.get("batch_output") or []:
            for target in b.get("target_name") or []:
                out = outputs.get(target, {})
                dims = (out.get("reshape") or {}).get("shape") if "reshape" in out else out.get("dims")
                scatter[target] = ((b.get("source_input") or [""])[0], [-1] + [int(d) for d in dims or []])
        if not (ragged or batch_inputs or scatter):
            return None
        return cls(ragged, batch_inputs, scatter)

    # ------------------------------------------------------------------ inputs

    def gather(self, requests: list[WorkerRequest], concat: Concat) -> tuple[dict[str, Any], list[int]]:
        """The model's inputs for the batch and each request's batch size."""
        plain = [{k: v for k, v in r.inputs.items() if k not in self.ragged} for r in requests]
        sizes = [int(next(iter(r.inputs.values())).shape[0]) for r in requests]
        if any(plain):
            views = [WorkerRequest(p, r.requested_outputs) for p, r in zip(plain, requests)]
            inputs, _ = concat(views) if len(requests) > 1 else (dict(plain[0]), sizes)
        else:
            inputs = {}
        for name in self.ragged:
            parts = [np.asarray(r.inputs[name]).reshape(-1) for r in requests if name in r.inputs]
            if parts:
                inputs[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        for b in self.batch_inputs:
            value = self._batch_input(b, requests)
            for target in b.targets:
                inputs[target] = value
        return inputs, sizes

    @staticmethod
    def _batch_input(b: BatchInput, requests: list[WorkerRequest]) -> np.ndarray:
        shapes = [tuple(np.shape(r.inputs[b.source])) for r in requests]
        counts = np.array([int(np.prod(s)) for s in shapes], dtype=np.int64)
        if b.kind == "BATCH_ELEMENT_COUNT":
            return counts.astype(b.dtype)
        if b.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
            return np.cumsum(counts).astype(b.dtype)
        if b.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
            return np.concatenate([[0], np.cumsum(counts)]).astype(b.dtype)
        if b.kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
            return np.zeros(int(counts.max()), dtype=b.dtype)
        items = [list(s[1:]) for s in shapes for _ in range(s[0])]
        rank = max(len(s) - 1 for s in shapes)
        table = np.array(items, dtype=b.dtype).reshape(len(items), rank)
        return table if b.kind == "BATCH_ITEM_SHAPE" else table.reshape(-1)

    # ------------------------------------------------------------------ outputs

    def split(self, outputs: dict[str, Any], requests: list[WorkerRequest],
              sizes: list[int]) -> list[dict[str, Any]]:
        """Each request's outputs: batch outputs scattered by its source input's shape, the
        others sliced along the batch dimension (views, no copy)."""
        per: list[dict[str, Any]] = [{} for _ in requests]
        for name, arr in outputs.items():
            if name in self.scatter:
                source, dims = self.scatter[name]
                flat = np.asarray(arr).reshape(-1)
                start = 0
                for i, r in enumerate(requests):
                    in_shape = np.shape(r.inputs[source])
                    shape = [in_shape[k] if d == -1 and k < len(in_shape) else d for k, d in enumerate(dims)]
                    n = int(np.prod(shape))
                    per[i][name] = flat[start:start + n].reshape(shape)
                    start += n
            else:
                start = 0
                for i, n in enumerate(sizes):
                    per[i][name] = arr[start:start + n]
                    start += n
        return per
