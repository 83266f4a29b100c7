"""Gathering a batch (one copy per input) and splitting its outputs (views, no copy); a model
that uses ragged batching gathers and splits by its RaggedPlan (ragged.py)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tritond.wire.schema import ModelView

from .base import WorkerRequest, WorkerResponse
from .ragged import RaggedPlan


def concat_inputs(requests: list[WorkerRequest]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Concatenate each input along axis 0; returns the batch and each request's size."""
    names = list(requests[0].inputs)
    sizes = [int(r.inputs[names[0]].shape[0]) for r in requests]
    batch = {n: np.concatenate([r.inputs[n] for r in requests], axis=0) for n in names}
    return batch, sizes


def split_outputs(outputs: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    """Slice each output back per request along axis 0 (views into the batch output)."""
    out: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, arr in outputs.items():
        start = 0
        for i, n in enumerate(sizes):
            out[i][name] = arr[start:start + n]
            start += n
    return out


def execute_batch(
    requests: list[WorkerRequest],
    run: Callable[[dict[str, Any]], dict[str, Any]],
    batching: bool,
    concat: Callable[[list[WorkerRequest]], tuple[dict[str, Any], list[int]]] = concat_inputs,
    ragged: RaggedPlan | None = None,
) -> list[WorkerResponse]:
    """Run a framework once per batch (batching models) or once per request, and hand each
    request the outputs it asked for."""
    if batching and ragged is not None:
        inputs, sizes = ragged.gather(requests, concat)
        per_request = ragged.split(run(inputs), requests, sizes)
    elif batching:
        if len(requests) > 1:
            inputs, sizes = concat(requests)
        else:
            inputs, sizes = requests[0].inputs, None
        outputs = run(inputs)
        per_request = split_outputs(outputs, sizes) if sizes else [outputs]
    else:
        per_request = [run(r.inputs) for r in requests]
    return [
        WorkerResponse({k: v for k, v in out.items() if not req.requested_outputs or k in req.requested_outputs})
        for req, out in zip(requests, per_request)
    ]


class Reshapes:
    """A config's `reshape` entries: the shape a model sees for an input, and the dims a client
    sees for an output, each behind the batch dimension of a batching model."""

    def __init__(self, view: ModelView, config: dict) -> None:
        self.batching = view.max_batch_size > 0
        self.inputs = {i["name"]: list(i["reshape"].get("shape") or [])
                       for i in config.get("input") or [] if "reshape" in i}
        self.outputs = {o["name"]: list(o["dims"]) for o in config.get("output") or [] if "reshape" in o}

    def _apply(self, arr: np.ndarray, shape: list[int]) -> np.ndarray:
        return arr.reshape(([arr.shape[0]] if self.batching else []) + shape)

    def model_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.inputs:
            return inputs
        return {n: self._apply(a, self.inputs[n]) if n in self.inputs else a for n, a in inputs.items()}

    def client_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.outputs:
            return outputs
        return {n: self._apply(a, self.outputs[n]) if n in self.outputs else a for n, a in outputs.items()}
