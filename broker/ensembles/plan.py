"""An ensemble's plan (its steps, who produces and reads each tensor) and its entry in the
model table, whose state is derived from the models it composes, so it needs no bookkeeping
of its own."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritond.repository.spec import ModelSpec
from tritond.repository.ensemble import decoupled_branching_error, validate_ensemble
from tritond.repository.render import config_from_json
from tritond.wire.schema import ModelState, TensorDesc

from tritond.broker.ensembles.gate import StepGate
from tritond.broker.tables.model_version import LOADING, READY, UNAVAILABLE, ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")


# ---------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Step:
    index: int
    model: str
    version: int
    inputs: dict[str, str]      # composing model input -> ensemble tensor
    outputs: dict[str, str]     # composing model output -> ensemble tensor

    def label(self) -> str:
        return f"step {self.index} (model '{self.model}')"


class Plan:
    """An ensemble's steps and who produces and reads each ensemble tensor."""

    def __init__(self, config: dict) -> None:
        steps = (config.get("ensemble_scheduling") or {}).get("step") or []
        self.steps = [
            Step(i, s["model_name"], int(s.get("model_version", -1)),
                 dict(s.get("input_map") or {}), dict(s.get("output_map") or {}))
            for i, s in enumerate(steps)
        ]
        self.inputs = [io["name"] for io in config.get("input") or []]
        # As in Triton, behind the batch dimension: an input with a `reshape` reaches the steps in
        # that shape, and an output with one reaches the client in its `dims`.
        self.batching = int(config.get("max_batch_size") or 0) > 0
        self.reshapes = {io["name"]: [int(d) for d in (io["reshape"].get("shape") or [])]
                         for io in config.get("input") or [] if "reshape" in io}
        self.output_dims = {io["name"]: [int(d) for d in io.get("dims") or []]
                            for io in config.get("output") or [] if "reshape" in io}
        self.outputs = [io["name"] for io in config.get("output") or []]
        self.producer = {t: s.index for s in self.steps for t in s.outputs.values()}
        self._needed: dict[tuple[str, ...], tuple[tuple[bool, ...], frozenset[str]]] = {}
        self.consumers: dict[str, list[int]] = {}
        for s in self.steps:
            for t in dict.fromkeys(s.inputs.values()):
                self.consumers.setdefault(t, []).append(s.index)

    def step_view(self, d: TensorDesc) -> TensorDesc:
        """A request input as the steps read it: in its `reshape` shape when the config has one."""
        return self._reshaped(d, self.reshapes.get(d.name))

    def client_view(self, d: TensorDesc) -> TensorDesc:
        """An ensemble output as the client reads it: in its `dims` when the config reshapes it."""
        return self._reshaped(d, self.output_dims.get(d.name))

    def _reshaped(self, d: TensorDesc, shape: list[int] | None) -> TensorDesc:
        if shape is None:
            return d
        return TensorDesc(d.name, d.datatype, (d.shape[:1] if self.batching else []) + shape, d.loc)

    def needed(self, wanted: tuple[str, ...]) -> tuple[tuple[bool, ...], frozenset[str]]:
        """Steps that contribute to the wanted outputs, and every tensor they must produce."""
        known = self._needed.get(wanted)
        if known is not None:
            return known
        run = [False] * len(self.steps)
        tensors: set[str] = set()
        todo = list(wanted)
        while todo:
            t = todo.pop()
            if t in tensors:
                continue
            tensors.add(t)
            i = self.producer.get(t)
            if i is not None and not run[i]:
                run[i] = True
                todo.extend(self.steps[i].inputs.values())
        if len(self._needed) < 64:       # requested-output sets are few; bound it all the same
            self._needed[wanted] = (tuple(run), frozenset(tensors))
        return tuple(run), frozenset(tensors)

    def downstream(self, i: int) -> frozenset[int]:
        """The steps that read what step `i` makes, directly or through other steps."""
        below: set[int] = set()
        todo = [i]
        while todo:
            for t in self.steps[todo.pop()].outputs.values():
                for j in self.consumers.get(t, ()):
                    if j not in below:
                        below.add(j)
                        todo.append(j)
        return frozenset(below)


# ---------------------------------------------------------------------- the table entry

class EnsembleVersion(ModelVersion):
    """An ensemble in the model table. Its state is derived: READY while every model it composes
    is READY (LOADING while one still loads, UNAVAILABLE naming the step otherwise), so health,
    startup and load replies follow the composing models without any bookkeeping elsewhere.
    Once they are all READY it is checked once more against their completed configs (a Python
    model's inputs and outputs are only known after its worker auto-completed them). Reading the
    state changes nothing; what the completed configs imply for the ensemble's own config (it is
    decoupled when a step is) is applied by `settle`, before the table is published."""

    _deriving = False
    _announced = False      # its READY was logged
    _refused = ""           # the derived reason it was last logged UNAVAILABLE for

    def __init__(self, registry: ModelRegistry, spec: ModelSpec, version: int, config: dict, error: str = "",
                 latency: Callable[[Any], Any] | None = None) -> None:
        """`error`: why the ensemble itself is invalid (UNAVAILABLE); else its state follows
        the models it composes. `latency`: builds its latency observer, as for every version."""
        self.registry = registry
        self.proto = spec.config
        self.plan = Plan(config)
        limit = int((config.get("ensemble_scheduling") or {}).get("max_inflight_requests") or 0)
        self.gate = StepGate(limit, len(self.plan.steps)) if limit > 0 else None
        if self.gate is not None and not error:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d", spec.name, limit)
        self._checked: tuple[tuple, str, bool] | None = None    # (composing configs, error, decoupled)
        super().__init__(spec.name, version, spec.path, os.path.dirname(spec.path), config, latency=latency)
        self._own_state, self._own_reason = (UNAVAILABLE, error) if error else (READY, "")

    @property
    def state(self) -> ModelState:
        return self._derive()[0]

    @state.setter
    def state(self, value: ModelState) -> None:
        self._own_state = value

    @property
    def reason(self) -> str:
        return self._derive()[1]

    @reason.setter
    def reason(self, value: str) -> None:
        self._own_reason = value

    def _derive(self) -> tuple[ModelState, str]:
        if self._own_state != READY:
            return self._own_state, self._own_reason
        if self._deriving:
            return UNAVAILABLE, f"ensemble '{self.name}' composes itself through other ensembles"
        self._deriving = True
        try:
            loading = False
            ready: list[ModelVersion] = []
            for step in self.plan.steps:
                state, reason, mv = self.composing(step)
                if state == UNAVAILABLE:
                    return UNAVAILABLE, reason
                loading = loading or state == LOADING
                if mv is not None:
                    ready.append(mv)
            if loading:
                return LOADING, ""
            error = self._validate(ready)
            return (UNAVAILABLE, error) if error else (READY, "")
        finally:
            self._deriving = False

    @property
    def streams(self) -> bool:
        """Whether a step is decoupled, as derived when this ensemble was last found READY (its
        own view says so only once `settle` has applied it, which may come after an enclosing
        ensemble is checked)."""
        return self._checked is not None and self._checked[2]

    @property
    def restarting(self) -> bool:
        """Restarting while every composing model that does not serve is restarting: a request
        then waits in that model's queue, as it would sent to the model itself."""
        if self._own_state != READY or self._deriving or self.state != UNAVAILABLE:
            return False
        self._deriving = True
        try:
            for step in self.plan.steps:
                versions = self.registry.get(step.model)
                candidates = [versions[step.version]] if step.version in versions else \
                    [] if step.version >= 0 else list(versions.values())
                if not any(mv.state == READY or mv.restarting for mv in candidates):
                    return False
            return True
        finally:
            self._deriving = False

    @restarting.setter
    def restarting(self, value: bool) -> None:
        pass        # derived from the composing models

    def composing(self, step: Step) -> tuple[ModelState, str, ModelVersion | None]:
        """(state, reason, the READY version serving the step or None)."""
        versions = self.registry.get(step.model)
        if step.version >= 0:
            candidates = [versions[step.version]] if step.version in versions else []
        else:
            candidates = list(versions.values())
        ready = [mv for mv in candidates if mv.state == READY]
        if ready:
            return READY, "", max(ready, key=lambda mv: mv.version)
        if any(mv.state == LOADING for mv in candidates):
            return LOADING, "", None
        if not candidates:      # nothing loaded for the step: Triton's words
            if step.version >= 0 and versions:
                return UNAVAILABLE, (f"ensemble '{self.name}' depends on '{step.model}' whose required version "
                                     f"{step.version} is not loaded."), None
            return UNAVAILABLE, f"ensemble '{self.name}' depends on '{step.model}' which has no loaded version.", None
        which = f"version {step.version} of model '{step.model}'" if step.version >= 0 else f"model '{step.model}'"
        why = "; ".join(sorted({mv.reason for mv in candidates if mv.reason})) or "not loaded"
        return UNAVAILABLE, f"in ensemble '{self.name}', {step.label()}: composing {which} is not available: {why}", None

    def _validate(self, composing: list[ModelVersion]) -> str:
        key = tuple(mv.config for mv in composing)
        if self._checked is not None and len(key) == len(self._checked[0]) and all(
                a is b for a, b in zip(key, self._checked[0])):
            return self._checked[1]
        specs = {mv.name: ModelSpec(mv.name, mv.model_dir, config_from_json(mv.config), [mv.version])
                 for mv in composing}
        decoupled = {mv.name for mv in composing
                     if mv.view.decoupled or (isinstance(mv, EnsembleVersion) and mv.streams)}
        error = (validate_ensemble(self.proto, specs) or decoupled_branching_error(self.proto, decoupled)
                 or self._cached_stream(decoupled))
        self._checked = (key, error, bool(decoupled))
        return error

    def settle(self, now: float) -> None:
        """Apply what the composing models' completed configs imply: as Triton, an ensemble
        with a decoupled step is decoupled itself (its config says so, and it streams). The
        first time it is READY it is logged as loaded, as every other model is; made UNAVAILABLE by
        the models it composes (not while they restart), it is logged with the reason, once per reason."""
        state, reason = self._derive()
        restarts = any(mv.restarting for step in self.plan.steps for mv in self.registry.get(step.model).values())
        if state == UNAVAILABLE and self._own_state == READY and reason != self._refused and not restarts:
            self._refused = reason
            log.error("model '%s' version %d is UNAVAILABLE: %s", self.name, self.version, reason)
        if state != READY or self._checked is None:
            return
        self._refused = ""
        if not self._announced:
            self._announced = True
            self.load_duration = now - self.load_started if self.load_started else 0.0
            log.info("loaded model '%s' version %d in %.3f s", self.name, self.version, self.load_duration)
            log.info("model '%s' version %d is READY", self.name, self.version)
        decoupled = self._checked[2]
        if decoupled != self.view.decoupled:
            self.config.setdefault("model_transaction_policy", {})["decoupled"] = decoupled
            self.view.decoupled = decoupled
            self.registry.dirty = True

    def _cached_stream(self, decoupled: set[str]) -> str:
        """An ensemble with a decoupled step is decoupled (as in Triton), which the response cache
        does not support: Triton refuses such an ensemble that enables the cache, in its words."""
        if decoupled and self.proto.response_cache.enable:
            return (f"Response Cache does not currently support model {self.name} with 'decoupled' transaction "
                    f"policy. Please disable the response cache.")
        return ""
