"""A model's warmup samples (`model_warmup` in its config), as Triton builds them.

Each sample is `batch_size` requests executed together, `count` times (at least once); a
sample of batch size 0 is skipped. Every input needs fixed dims and one data kind:
`zero_data`, `random_data` (zeros for strings, as in Triton) or `input_data_file`, a raw
file in the model's `warmup/` directory (strings in Triton's length-prefixed form). A batching
model's inputs, control inputs included, get a batch dimension of 1. Errors name the sample, since a bad sample fails
the load.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .datatypes import CONFIG_TO_WIRE, WIRE_TO_NUMPY, byte_size, deserialize_bytes, element_count

WARMUP_DIR = "warmup"


class WarmupError(Exception):
    pass


@dataclass
class Sample:
    name: str
    batch_size: int
    count: int
    inputs: dict[str, tuple[str, np.ndarray]]     # name -> (wire datatype, data)


def _data_file(model_dir: str, rel: str, sample: str) -> bytes:
    parts = rel.split("/")
    if not rel or "\0" in rel or rel.startswith("/") or ".." in parts:
        raise WarmupError(f"warmup sample '{sample}': input_data_file '{rel}' must name a file inside "
                          f"the model's '{WARMUP_DIR}' directory")
    path = os.path.join(model_dir, WARMUP_DIR, *parts)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise WarmupError(f"warmup sample '{sample}': cannot read input_data_file '{rel}': {e.strerror}") from None


def _array(spec: dict[str, Any], datatype: str, shape: list[int], model_dir: str, sample: str,
           name: str, rng: np.random.Generator) -> np.ndarray:
    dtype = WIRE_TO_NUMPY[datatype]
    count = element_count(shape)
    if "input_data_file" in spec:
        data = _data_file(model_dir, str(spec["input_data_file"]), sample)
        if datatype == "BYTES":
            try:
                return deserialize_bytes(data, count).reshape(shape)
            except ValueError as e:
                raise WarmupError(f"warmup sample '{sample}': input '{name}': {e}") from None
        need = byte_size(datatype, shape)
        if len(data) < need:
            raise WarmupError(f"warmup sample '{sample}': input '{name}' needs {need} bytes, but "
                              f"'{spec['input_data_file']}' has only {len(data)}")
        return np.frombuffer(data[:need], dtype=dtype).reshape(shape).copy()
    # zero_data/random_data are a oneof: being set picks the data, whatever the bool says (as in Triton)
    if "random_data" in spec and datatype != "BYTES":
        if datatype == "BOOL":
            return rng.integers(0, 2, shape).astype(np.bool_)
        if dtype.kind == "f":
            return rng.random(shape).astype(dtype)
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127), shape, endpoint=True).astype(dtype)
    if "zero_data" in spec or "random_data" in spec:
        if datatype == "BYTES":
            out = np.empty(count, dtype=np.object_)
            out[:] = [b""] * count
            return out.reshape(shape)
        return np.zeros(shape, dtype=dtype)
    raise WarmupError(f"warmup sample '{sample}': input '{name}' sets no data "
                      f"(zero_data, random_data or input_data_file)")


def warmup_samples(config: dict[str, Any], model_dir: str, seed: int | None = None) -> list[Sample]:
    """The samples of a config (as GET /config renders it); raises WarmupError."""
    if not config.get("model_warmup"):
        return []       # numpy.random is not imported for nothing: every worker would pay it
    batching = int(config.get("max_batch_size", 0) or 0) > 0
    rng = np.random.default_rng(seed)
    samples = []
    for i, w in enumerate(config.get("model_warmup") or []):
        name = str(w.get("name") or f"sample {i}")
        batch = int(w.get("batch_size", 0) or 0)
        if batch == 0:
            continue
        if batching and batch > int(config["max_batch_size"]):
            raise WarmupError(f"warmup sample '{name}': batch_size {batch} exceeds max_batch_size "
                              f"{config['max_batch_size']}")
        inputs = {}
        for input_name, spec in (w.get("inputs") or {}).items():
            datatype = CONFIG_TO_WIRE.get(str(spec.get("data_type", "")))
            if datatype is None:
                raise WarmupError(f"warmup sample '{name}': input '{input_name}' has no valid data_type")
            dims = [int(d) for d in spec.get("dims") or []]
            if any(d < 0 for d in dims):
                raise WarmupError(f"warmup sample '{name}': warmup setting expects all variable-size "
                                  f"dimensions are specified for input '{input_name}'")
            # a batching model's backend sees a batch dimension on every input, a control input
            # (Triton's override input of batch size 1) included
            shape = [1] + dims if batching else dims
            inputs[input_name] = (datatype, _array(spec, datatype, shape, model_dir, name, input_name, rng))
        samples.append(Sample(name, batch, max(1, int(w.get("count", 0) or 0)), inputs))
    return samples
