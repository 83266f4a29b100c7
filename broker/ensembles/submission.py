"""Ensembles on the broker's side: loaded after what they compose, their requests started as
`EnsembleRun`s (each step an ordinary request to a composing model's scheduler, so steps are
batched too), and the leases of multi-worker replies handed over under one identity."""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from tritond.repository.spec import ModelSpec
from tritond.repository.ensemble import ensemble_dependencies, validate_ensemble
from tritond.repository.layout import ModelSource
from tritond.wire.errors import TritonError
from tritond.wire.schema import Infer, InferReply, Release

from tritond.broker.tables.client_regions import ClientRegions
from tritond.broker.clock import Clock
from tritond.broker.ensembles.plan import EnsembleVersion, Step
from tritond.broker.ensembles.run import EnsembleRun
from tritond.broker.tables.inflight import ReplyTo, Req
from tritond.broker.tables.model_version import ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")


class Ensembles:
    """Loads ensembles after what they compose and runs their requests."""

    def __init__(self, registry: ModelRegistry, admit: Callable[[ReplyTo, Infer, ModelVersion, Any], Req | None],
                 regions: ClientRegions, route_release: Callable[[Release], None], clock: Clock,
                 config_name: str = "", cancel: Callable[[Req], None] | None = None,
                 latency: Callable[[Any], Any] | None = None) -> None:
        self.registry = registry
        self._admit = admit
        self._cancel = cancel
        self.regions = regions
        self._route_release = route_release
        self.clock = clock
        self.tracer: Any = None         # broker/observe/tracing.py's Tracer: traces of traced runs' steps
        self.cache: Any = None          # broker/scheduling/cache.py's ResponseCache, for steps' requests
        self.config_name = config_name
        self.latency = latency          # builds an ensemble version's latency observer (--metrics-config)
        self.rids = itertools.count(1)
        self.handovers: dict[bytes, dict[int, tuple[bytes, int]]] = {}
        self.handover_ids = itertools.count(1)
        self.composes: dict[str, list[str] | None] = {}    # the steps' models of each model load_order saw

    # ---------------------------------------------------------------- loading

    def load_order(self, sources: dict[str, ModelSource], wanted: Iterable[str]) -> list[str]:
        """The wanted models plus every model their ensembles compose (transitively), each
        ensemble after the models it composes."""
        deps: dict[str, list[str] | None] = {}
        todo = sorted(wanted, reverse=True)
        while todo:
            name = todo.pop()
            if name in deps or name not in sources:
                continue
            deps[name] = ensemble_dependencies(sources[name].path, self.config_name)
            todo.extend(reversed(deps[name] or []))
        self.composes.update(deps)
        order = [n for n in sorted(deps) if deps[n] is None]
        placed = set(order)

        def place(name: str, path: set[str]) -> None:
            if name in placed or name not in deps or name in path:
                return
            for dep in deps[name] or []:
                place(dep, path | {name})
            placed.add(name)
            order.append(name)

        for name in sorted(deps):
            place(name, set())
        return order

    def dependencies(self, name: str) -> list[str]:
        """Models a loaded ensemble composes, directly or through nested ensembles."""
        out: list[str] = []
        todo = [name]
        while todo:
            for mv in self.registry.get(todo.pop()).values():
                if isinstance(mv, EnsembleVersion):
                    for step in mv.plan.steps:
                        if step.model not in out and step.model != name:
                            out.append(step.model)
                            todo.append(step.model)
        return out

    def setup(self, spec: ModelSpec, version: int, config: dict) -> EnsembleVersion:
        """The table entry of one ensemble version, checked against the composing models' specs."""
        error = self._cycle(spec) or validate_ensemble(spec.config, self.registry.specs)
        if error:
            log.error("ensemble '%s' is UNAVAILABLE: %s", spec.name, error)
        mv = EnsembleVersion(self.registry, spec, version, config, error, self.latency)
        self.registry.dirty = True
        return mv

    def _cycle(self, spec: ModelSpec) -> str:
        """Triton's check for an ensemble that composes itself, directly or through others."""
        start = spec.name

        def composes(name: str) -> list[str]:
            if name == start:
                return [step.model_name for step in spec.config.ensemble_scheduling.step]
            known = self.composes.get(name)
            if known is not None:
                return known
            other = self.registry.specs.get(name)
            config = other.config if other is not None else None
            return [step.model_name for step in config.ensemble_scheduling.step] if config is not None else []

        def visit(name: str, seen: set[str]) -> str:
            for up in composes(name):
                if up == start:
                    return f"circular dependency between ensembles: {start} -> ... -> {name} -> {start}"
                if up not in seen:
                    seen.add(up)
                    found = visit(up, seen)
                    if found:
                        return found
            return ""

        return visit(start, {start})

    def settle(self) -> None:
        """Before the table is published: each ensemble applies what its composing models'
        completed configs imply for its own (EnsembleVersion.settle)."""
        for mv in self.registry.all_versions():
            if isinstance(mv, EnsembleVersion):
                mv.settle(self.clock.now())

    # ---------------------------------------------------------------- requests

    def submit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion, trace: Any = None) -> "Req | EnsembleRun | None":
        """Queue a request for `mv`, an ensemble or not; returns its handle while in flight.
        `trace`: the request's (broker/observe/tracing.py), when it is traced."""
        if trace is not None and trace.setting.tensors:
            reply = self.tracer.trace_outputs(trace, reply)
        if isinstance(mv, EnsembleVersion):
            return self.run(reply, msg, mv, trace)
        return self._admit(reply, msg, mv, trace)

    def run(self, reply: ReplyTo, msg: Infer, mv: "EnsembleVersion", trace: Any = None) -> EnsembleRun | None:
        """Start an ensemble request (from a frontend, a BLS call or an enclosing ensemble);
        returns it while it is still in flight."""
        try:
            regions = self.regions.resolve(msg)
        except TritonError as e:
            reply(InferReply(msg.rid, error=e))
            return None
        if trace is not None and trace.setting.tensors:
            trace.queued(msg)
        run = EnsembleRun(self, reply, msg, mv, regions, self.clock.now_ns(), trace)
        run.start()
        return None if run.done else run

    def cancel_running(self, req: Req) -> None:
        """A step that executes is told its request was cancelled."""
        if self._cancel is not None:
            self._cancel(req)

    def on_gpu(self, step: Step) -> bool:
        """True when the model serving `step` runs only GPU instances, whose workers open device
        inputs in place (a nested ensemble is not looked into: it gets host memory)."""
        try:
            mv = self.registry.resolve(step.model, step.version)
        except TritonError:
            return False
        if isinstance(mv, EnsembleVersion) or not mv.instances:
            return False
        return all(inst.kind == "GPU" for inst in mv.instances)

    # ---------------------------------------------------------------- leases

    def release(self, units: Iterable[tuple[bytes, int]]) -> None:
        by_owner: dict[bytes, list[int]] = {}
        for owner, lease in units:
            by_owner.setdefault(owner, []).append(lease)
        for owner, leases in by_owner.items():
            self._route_release(Release(owner, leases))

    def hand_over(self, units: list[tuple[bytes, int]]) -> tuple[bytes, dict[tuple[bytes, int], int]]:
        """Outputs leased from several workers travel under one identity the receiver releases."""
        owner = b"ensemble:%d" % next(self.handover_ids)
        numbers = {unit: k for k, unit in enumerate(units, 1)}
        self.handovers[owner] = {k: unit for unit, k in numbers.items()}
        return owner, numbers

    def release_handover(self, msg: Release) -> bool:
        """Release what a receiver of a multi-worker ensemble reply is done with; False when
        `msg.owner` is not such an identity (then it names a worker)."""
        table = self.handovers.get(msg.owner)
        if table is None:
            return False
        self.release(table.pop(k) for k in msg.leases if k in table)
        if not table:
            del self.handovers[msg.owner]
        return True
