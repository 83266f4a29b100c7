"""Triton's `identity` backend (triton-inference-server/identity_backend), built in: each
OUTPUT<i> is a copy of INPUT<i>, request by request, in the request's own shape. Triton's test
repositories and examples use it for models that need no framework (ensemble glue, batching and
queueing tests), with its parameters:

- `execute_delay_ms`: sleep this long once per execution (a batch of requests);
- `instance_wise_delay_multiplier`: with it, instance i (in creation order) sleeps
  delay * max(multiplier * i, 1);
- `creation_delay_sec`: sleep this long while the model loads.

An optional input that a request leaves out gives a zero output of the input's config dims
(variable dims as 1, behind the request's batch size when the model batches).
"""
from __future__ import annotations

import re
import time

import numpy as np

from tritond.repository.backends import IDENTITY
from tritond.repository.datatypes import WIRE_TO_NUMPY
from tritond.repository.parameters import config_parameter
from tritond.wire.errors import invalid, unsupported

from .base import Backend, WorkerRequest, WorkerResponse

_INPUT = re.compile(r"INPUT(\d+)$")
_OUTPUT = re.compile(r"OUTPUT(\d+)$")
SUPPORTED_PARAMETERS = ("execute_delay_ms", "instance_wise_delay_multiplier", "creation_delay_sec")


def _int_parameter(config: dict, key: str) -> int:
    raw = config_parameter(config, key)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise invalid(f"identity backend: parameter '{key}' must be an integer, got '{raw}'") from None


def _dims(t: dict) -> list[int]:
    reshape = t.get("reshape")
    return [int(d) for d in (reshape.get("shape") if reshape else t.get("dims")) or []]


class IdentityBackend(Backend):
    name = IDENTITY

    def load(self) -> None:
        cfg = self.config
        if config_parameter(cfg, "enable_custom_tracing") == "true":
            raise invalid("identity backend: 'enable_custom_tracing' (custom trace activities) is not "
                          "supported by tritond")
        inputs, outputs = cfg.get("input") or [], cfg.get("output") or []
        if len(inputs) != len(outputs):
            raise invalid("model configuration must have equal input/output pairs")
        by_index: dict[str, dict] = {}
        self.optional: dict[str, tuple[str, list[int]]] = {}
        for t in inputs:
            m = _INPUT.match(t["name"])
            if not m:
                raise invalid(f"expected input name to follow INPUT<index> pattern, got '{t['name']}'")
            by_index[m.group(1)] = t
            if t.get("optional"):
                self.optional[m.group(1)] = (self.view.inputs[t["name"]].datatype,
                                             [1 if d < 0 else d for d in _dims(t)])
        for t in outputs:
            m = _OUTPUT.match(t["name"])
            if not m:
                raise invalid(f"expected output name to follow OUTPUT<index> pattern, got '{t['name']}'")
            source = by_index.get(m.group(1))
            if source is None:
                raise invalid("expected input and output indices to match")
            if source.get("data_type") != t.get("data_type"):
                raise invalid(f"expected input and output datatype to match, got {source.get('data_type')} "
                              f"and {t.get('data_type')}")
            if _dims(source) != _dims(t):
                raise invalid(f"expected input and output shape to match, got {_dims(source)} and {_dims(t)}")
        self.outputs = list(self.view.outputs)
        self.batching = self.view.max_batch_size > 0
        delay = _int_parameter(cfg, "execute_delay_ms")
        multiplier = _int_parameter(cfg, "instance_wise_delay_multiplier")
        if multiplier > 0:
            multiplier *= self.instance.index
        self.delay_s = delay * max(multiplier, 1) / 1000.0
        creation = _int_parameter(cfg, "creation_delay_sec")
        if creation > 0:
            time.sleep(creation)

    def execute(self, requests: list[WorkerRequest]) -> list[WorkerResponse]:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return [self._one(r) for r in requests]

    def _one(self, req: WorkerRequest) -> WorkerResponse:
        batch = None
        if self.batching and req.inputs:
            first = next(iter(req.inputs.values()))
            batch = int(first.shape[0]) if first.ndim else None
        out: dict[str, np.ndarray] = {}
        for name in req.requested_outputs or self.outputs:
            index = name[len("OUTPUT"):]
            source = req.inputs.get("INPUT" + index)
            if source is not None:
                out[name] = source
            elif index in self.optional:
                datatype, dims = self.optional[index]
                shape = ([batch] if batch is not None else []) + dims
                out[name] = (np.full(shape, b"", dtype=object) if datatype == "BYTES"
                             else np.zeros(shape, dtype=WIRE_TO_NUMPY[datatype]))
            else:
                return WorkerResponse(error=unsupported(f"failed to get input 'INPUT{index}'"))
        return WorkerResponse(out)
