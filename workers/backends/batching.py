"""Gathering a batch (one copy per input) and splitting its outputs (views, no copy)."""
from __future__ import annotations

import numpy as np

from .base import WorkerRequest


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
