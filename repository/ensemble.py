"""Ensemble validation against the models it composes.

An ensemble is a data-flow graph over other models' tensors, so it can only be
checked once the composing models' configs are known: every tensor must be
produced before it is read, by exactly one step, without cycles, with the data
types the composing models declare.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

from .backends import ENSEMBLE_PLATFORM, PYTHON, runner
from .config import config_path, parse_config_text
from .ensemble_flow import flow_error
from .errors import ConfigError
from .spec import ModelSpec

DataType = model_config_pb2.DataType


def _writes_input(cfg: model_config_pb2.ModelConfig) -> str | None:
    """A step may not overwrite an ensemble input (Triton's graph would treat it as given)."""
    inputs = {io.name for io in cfg.input}
    for i, step in enumerate(cfg.ensemble_scheduling.step):
        for tensor in step.output_map.values():
            if tensor in inputs:
                return f"in ensemble '{cfg.name}', step {i} (model '{step.model_name}') writes ensemble input '{tensor}'"
    return None


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


@dataclass(frozen=True)
class _Tensor:
    """What one side (the ensemble or a composing model) says an ensemble tensor is."""

    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]     # with the batch dimension when that side batches
    model: str

    @classmethod
    def of(cls, io, batching: bool, model: str, ensemble_io: bool = False) -> "_Tensor":
        dims = tuple(io.reshape.shape) if ensemble_io and io.HasField("reshape") else tuple(io.dims)
        return cls(io.data_type, dims, ((-1,) if batching else ()) + dims, model)

    def conflict(self, other: "_Tensor") -> str | None:
        """Triton's consistency rule: same type; shapes equal up to -1, with or without the batch dim."""
        if self.data_type != other.data_type:
            return (
                f"inconsistent data type: {DataType.Name(self.data_type)} is inferred from model {self.model} "
                f"while {DataType.Name(other.data_type)} is inferred from model {other.model}"
            )
        if not _dims_match(self.dims, other.dims) and not _dims_match(self.full_dims, other.full_dims):
            return (
                f"inconsistent shape: {_dims_text(self.full_dims)} is inferred from model {self.model} "
                f"while {_dims_text(other.full_dims)} is inferred from model {other.model}"
            )
        return None


def _not_autocompleted(cfg: model_config_pb2.ModelConfig) -> bool:
    """A Python model whose inputs/outputs its worker has not filled in yet: nothing to compare."""
    return runner(cfg.backend, cfg.runtime) == PYTHON and not cfg.input and not cfg.output


def _composing_error(cfg: model_config_pb2.ModelConfig, specs: dict[str, ModelSpec]) -> str | None:
    """Triton's checks of the steps against their models, in its order and words: missing models
    first, then step by step its batch size, input mapping and output mapping."""
    name = cfg.name
    steps = cfg.ensemble_scheduling.step
    missing = sorted({step.model_name for step in steps if step.model_name not in specs})
    if missing:
        return f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}"
    # Data type and shape of each ensemble tensor, and the model they were inferred from.
    tensors: dict[str, _Tensor] = {}
    for io in (*cfg.input, *cfg.output):
        tensors.setdefault(io.name, _Tensor.of(io, cfg.max_batch_size > 0, name, ensemble_io=True))

    def agree(tensor: str, seen: _Tensor) -> str | None:
        known = tensors.setdefault(tensor, seen)
        problem = known.conflict(seen)
        return f"in ensemble {name}, ensemble tensor {tensor}: {problem}" if problem else None

    for step in steps:
        spec = specs[step.model_name]
        if spec.error or spec.config is None:
            return (f"ensemble '{name}' depends on '{step.model_name}' which has no loaded version. Model "
                    f"'{step.model_name}' loading failed with error: {spec.error}")
        sub = spec.config
        if sub.max_batch_size != 0 and sub.max_batch_size < cfg.max_batch_size:
            return (
                f"ensemble {name} allows maximum batch size {cfg.max_batch_size}, but it contains model "
                f"{step.model_name} which only allows maximum batch size to be {sub.max_batch_size}"
            )
        if _not_autocompleted(sub):
            continue
        batching = sub.max_batch_size > 0
        inputs = {io.name: io for io in sub.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                return (f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                        f"{model_input} in model {step.model_name}")
        for io in sub.input:
            if io.name in step.input_map:
                err = agree(step.input_map[io.name], _Tensor.of(io, batching, step.model_name))
                if err:
                    return err
            elif not io.optional:
                return (f"in ensemble {name}, input {io.name} in model {step.model_name} is not mapped to any "
                        "ensemble tensors")
        outputs = {io.name: io for io in sub.output}
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                return (f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                        f"{model_output} in model {step.model_name}")
        for model_output, tensor in step.output_map.items():
            err = agree(tensor, _Tensor.of(outputs[model_output], batching, step.model_name))
            if err:
                return err
    return None


class _Flow:
    """A tensor in Triton's decoupled-label walk: who produced it, what it was produced from."""
    __slots__ = ("model", "decoupled", "label", "visited", "prev", "next", "sibling")

    def __init__(self, model: str, decoupled: bool = False) -> None:
        self.model, self.decoupled, self.label, self.visited = model, decoupled, 0, False
        self.prev: list[_Flow] = []
        self.next: list[_Flow] = []
        self.sibling: _Flow | None = None


def decoupled_branching_error(cfg: model_config_pb2.ModelConfig, decoupled: set[str]) -> str | None:
    """Triton's rule for decoupled steps: every step (and the ensemble's outputs together) must
    take its inputs from responses of one decoupled model at most, since responses of different
    decoupled models cannot be paired. `decoupled` names the decoupled composing models."""
    name = cfg.name
    tensors: dict[str, _Flow] = {io.name: _Flow(name) for io in cfg.input}
    sink = _Flow(name)
    for io in cfg.output:
        node = tensors.setdefault(io.name, _Flow(name))
        sink.prev.append(node)
        node.next.append(sink)
    for step in cfg.ensemble_scheduling.step:
        is_decoupled = step.model_name in decoupled
        sibling = _Flow(step.model_name)
        for tensor in step.input_map.values():
            tensors.setdefault(tensor, _Flow(step.model_name))
        for tensor in step.output_map.values():
            node = tensors.setdefault(tensor, _Flow(step.model_name))
            node.sibling, node.decoupled = sibling, is_decoupled
            for read in step.input_map.values():
                node.prev.append(tensors[read])
                tensors[read].next.append(node)
    label = 0
    queue = []
    for io in cfg.input:
        tensors[io.name].visited = True
        queue.append(tensors[io.name])
    while queue:
        current = queue.pop(0)
        for nxt in current.next:
            if nxt.visited or not all(p.visited for p in nxt.prev):
                continue
            first = nxt.prev[0].label
            if any(p.label != first for p in nxt.prev):
                return (f"in ensemble {name}, step of model '{nxt.model}' receives inputs originated from different "
                        "decoupled models")
            if nxt.sibling is not None and nxt.sibling.visited:
                nxt.label = nxt.sibling.label
            else:
                if nxt.decoupled:
                    label += 1
                nxt.label = label if nxt.decoupled else first
                if nxt.sibling is not None:
                    nxt.sibling.label, nxt.sibling.visited = nxt.label, True
            nxt.visited = True
            queue.append(nxt)
    return None


def validate_ensemble(cfg: model_config_pb2.ModelConfig, specs: dict[str, ModelSpec]) -> str | None:
    """Why the ensemble `cfg` cannot run over the models in `specs`, or None.

    Checks steps, cycles, tensors read but never produced, ensemble outputs no
    step produces, unknown or unavailable composing models, and data types that
    disagree between a composing model's config and the ensemble tensor.
    Python composing models not yet auto-completed are checked by name only.
    """
    return flow_error(cfg) or _writes_input(cfg) or _composing_error(cfg, specs)


def ensemble_dependencies(model_path: str, config_name: str = "") -> list[str] | None:
    """The models an ensemble's steps name, read from its config file alone (no auto-complete);
    None when the model is not an ensemble or its config cannot be read, which loading reports."""
    path = config_path(model_path, config_name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            cfg = parse_config_text(f.read(), os.path.basename(model_path), path)
    except (OSError, UnicodeDecodeError, ConfigError):
        return None
    if cfg.platform != ENSEMBLE_PLATFORM:
        return None
    return list(dict.fromkeys(step.model_name for step in cfg.ensemble_scheduling.step))
