"""Models that call models, inside the broker: ensemble DAGs and BLS calls from workers.

An ensemble request never reaches a worker as such. The broker walks the ensemble's steps:
a step becomes an ordinary request to its composing model's scheduler (so dynamic batching
applies across ensemble requests) as soon as every tensor it reads exists, and independent
steps run at the same time. Tensors move between steps as descriptors, never as bytes:
an intermediate stays in the producing worker's arena under a lease the broker holds until
the ensemble request is answered, then releases (also on every error path). An intermediate
that only GPU instances read may stay in the producer's device memory (`OutputSpec.device_ok`:
its descriptor then carries a CUDA IPC handle, under the same lease rule); what the runner
answers with is always in host memory unless its own requester accepts device memory.

A BLS call is an Infer that a Python worker sends while it executes. Before it is queued the
broker checks that some instance able to serve it is not itself waiting, directly or through
other calls, on the caller: such a call would wait forever, so it is refused instead.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import msgspec

from tritond.repository.catalog import ModelSpec
from tritond.repository.ensemble import ensemble_dependencies, validate_ensemble
from tritond.repository.layout import ModelSource
from tritond.repository.render import config_from_json

from . import protocol as P
from .models import LOADING, READY, UNAVAILABLE, ModelVersion

if TYPE_CHECKING:
    from .pool import Instance
    from .server import Broker

log = logging.getLogger("tritond.broker")

replace = msgspec.structs.replace

# Instance states from which an instance will (again) take work from its queue.
_LIVE = ("READY", "BUSY", "STARTING", "RESTARTING")


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
        self.outputs = [io["name"] for io in config.get("output") or []]
        self.producer = {t: s.index for s in self.steps for t in s.outputs.values()}
        self._needed: dict[tuple[str, ...], tuple[tuple[bool, ...], frozenset[str]]] = {}
        self.consumers: dict[str, list[int]] = {}
        for s in self.steps:
            for t in dict.fromkeys(s.inputs.values()):
                self.consumers.setdefault(t, []).append(s.index)

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


# ---------------------------------------------------------------------- the table entry

class EnsembleVersion(ModelVersion):
    """An ensemble in the model table. Its state is derived: READY while every model it composes
    is READY (LOADING while one still loads, UNAVAILABLE naming the step otherwise), so health,
    startup and load replies follow the composing models without any bookkeeping elsewhere.
    Once they are all READY it is checked once more against their completed configs (a Python
    model's inputs and outputs are only known after its worker auto-completed them)."""

    _deriving = False

    def __init__(self, broker: "Broker", spec: ModelSpec, version: int, config: dict) -> None:
        self._own_state, self._own_reason = LOADING, ""
        super().__init__(spec.name, version, spec.path, os.path.dirname(spec.path), config)
        self.broker = broker
        self.proto = spec.config
        self.plan = Plan(config)
        self._checked: tuple[tuple, str] | None = None

    @property
    def state(self) -> str:
        return self._derive()[0]

    @state.setter
    def state(self, value: str) -> None:
        self._own_state = value

    @property
    def reason(self) -> str:
        return self._derive()[1]

    @reason.setter
    def reason(self, value: str) -> None:
        self._own_reason = value

    def _derive(self) -> tuple[str, str]:
        if self._own_state != READY or not hasattr(self, "plan"):
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

    def composing(self, step: Step) -> tuple[str, str, ModelVersion | None]:
        """(state, reason, the READY version serving the step or None)."""
        versions = self.broker.models.get(step.model) or {}
        if step.version >= 0:
            candidates = [versions[step.version]] if step.version in versions else []
        else:
            candidates = list(versions.values())
        ready = [mv for mv in candidates if mv.state == READY]
        if ready:
            return READY, "", max(ready, key=lambda mv: mv.version)
        if any(mv.state == LOADING for mv in candidates):
            return LOADING, "", None
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
        error = validate_ensemble(self.proto, specs) or ""
        self._checked = (key, error)
        return error


# ---------------------------------------------------------------------- one request

class _StepReply:
    """The reply callback of one step (Broker.send_reply calls it with the InferReply).

    A nested ensemble answering a step hands its leases over through `adopt` and names the
    worker behind each output in `owners`, since its reply has no single owner."""
    __slots__ = ("run", "index", "owners")

    def __init__(self, run: "_Run", index: int) -> None:
        self.run = run
        self.index = index
        self.owners: dict[str, bytes] | None = None

    def __call__(self, reply: P.InferReply) -> None:
        self.run.on_step_reply(self.index, reply, self.owners)

    def adopt(self, units: list[tuple[bytes, int]], owners: dict[str, bytes]) -> None:
        self.run.held.extend(units)
        self.owners = owners


class _Run:
    """One ensemble request in flight: the tensors that exist, the steps still waiting, the
    steps queued or executing, and every lease held on intermediates."""

    def __init__(self, ens: "Ensembles", src: Any, msg: P.Infer, mv: EnsembleVersion, regions: list) -> None:
        self.ens = ens
        self.b = ens.b
        self.src = src
        self.msg = msg
        self.mv = mv
        self.plan = plan = mv.plan
        self.regions = regions
        self.arrival_ns = time.monotonic_ns()
        self.out_specs = {o.name: o for o in msg.outputs}
        self.wanted = tuple(o.name for o in msg.outputs) or tuple(plan.outputs)
        self.run_step, self.needed = plan.needed(self.wanted)
        self.tensors: dict[str, P.TensorDesc] = {d.name: d for d in msg.inputs}
        self.owner_of: dict[str, bytes] = {}
        present = set(self.tensors) | (set(plan.inputs) - set(self.tensors))  # absent optional inputs
        self.waiting = [sum(1 for t in dict.fromkeys(s.inputs.values()) if t not in present) for s in plan.steps]
        self.started = [False] * len(plan.steps)
        self.active: dict[int, Any] = {}      # step -> its Req (queued or executing) or nested _Run
        self.held: list[tuple[bytes, int]] = []
        self.error: P.Err | None = None
        self.done = False
        self.starting = False

    # ---------------------------------------------------------------- progress

    def start(self) -> None:
        self.starting = True
        for i, run in enumerate(self.run_step):
            if self.error is not None:
                break
            if run and not self.started[i] and self.waiting[i] == 0:
                self.start_step(i)
        self.starting = False
        self.maybe_finish()

    def start_step(self, i: int) -> None:
        step = self.plan.steps[i]
        self.started[i] = True
        mv, err = self.b.resolve(step.model, step.version)
        if err is not None:
            self.fail(step, err)
            return
        inputs = [replace(self.tensors[t], name=model_input, lease=0, region="")
                  for model_input, t in step.inputs.items() if t in self.tensors]
        outputs = [self.output_spec(model_output, t) for model_output, t in step.outputs.items() if t in self.needed]
        m = self.msg
        infer = P.Infer(next(self.ens.rids), step.model, mv.version, inputs, outputs, m.id, m.params,
                        m.priority, m.timeout_us, m.correlation_id, m.flags)
        self.active[i] = None
        reply = _StepReply(self, i)
        handle = self.ens.run(reply, infer, mv) if isinstance(mv, EnsembleVersion) else self.b.admit(reply, infer, mv)
        if i in self.active:        # not answered synchronously
            self.active[i] = handle

    def output_spec(self, model_output: str, tensor: str) -> P.OutputSpec:
        """A step output that is a requested ensemble output in a client region goes straight there."""
        o = self.out_specs.get(tensor)
        if o is not None and o.seg:
            return P.OutputSpec(model_output, "", o.seg, o.offset, o.nbytes)
        return P.OutputSpec(model_output, device_ok=self.device_ok(tensor))

    def device_ok(self, tensor: str) -> bool:
        """Whether `tensor` may stay in its producer's device memory: every step of this request
        reading it runs on GPU instances, and it is not part of the answer (unless the requester,
        an enclosing ensemble, takes device memory for it too)."""
        if tensor in self.wanted:
            spec = self.out_specs.get(tensor)
            if spec is None or not spec.device_ok:
                return False
        steps = self.plan.steps
        return all(self.ens.on_gpu(steps[j]) for j in self.plan.consumers.get(tensor, ()) if self.run_step[j])

    def on_step_reply(self, i: int, reply: P.InferReply, owners: dict[str, bytes] | None) -> None:
        self.active.pop(i, None)
        if owners is None:
            self.held.extend((reply.owner, lease) for lease in {d.lease for d in reply.outputs if d.lease})
        step = self.plan.steps[i]
        if self.error is None and not self.done:
            if reply.error is not None:
                self.fail(step, reply.error)
            else:
                self.accept(step, reply, owners)
        self.maybe_finish()

    def accept(self, step: Step, reply: P.InferReply, owners: dict[str, bytes] | None) -> None:
        by_name = {d.name: d for d in reply.outputs}
        produced = []
        for model_output, tensor in step.outputs.items():
            if tensor not in self.needed:
                continue
            d = by_name.get(model_output)
            if d is None:
                self.fail(step, P.Err("INTERNAL", f"the model returned no output '{model_output}'"))
                return
            spec = self.out_specs.get(tensor)
            if spec is not None and spec.seg:    # written into the client's region
                d = replace(d, seg=spec.seg, offset=spec.offset)
            self.tensors[tensor] = replace(d, name=tensor)
            self.owner_of[tensor] = reply.owner if owners is None else owners.get(model_output, b"")
            produced.append(tensor)
        for tensor in produced:
            for j in self.plan.consumers.get(tensor, ()):
                if self.run_step[j] and not self.started[j]:
                    self.waiting[j] -= 1
        self.starting = True
        for tensor in produced:
            for j in self.plan.consumers.get(tensor, ()):
                if self.error is None and self.run_step[j] and not self.started[j] and self.waiting[j] == 0:
                    self.start_step(j)
        self.starting = False

    def fail(self, step: Step, err: P.Err) -> None:
        if self.error is not None:
            return
        self.error = P.Err(err.code, f"in ensemble '{self.mv.name}', {step.label()} failed: {err.message}")
        self.cancel_queued()

    def cancel(self, err: P.Err) -> None:
        """Fail this request (a sibling step of an enclosing ensemble failed)."""
        if self.error is None and not self.done:
            self.error = err
            self.cancel_queued()
            self.maybe_finish()

    def cancel_queued(self) -> None:
        """Take not yet dispatched steps out of their queues; executing ones finish on their own."""
        for i, handle in list(self.active.items()):
            if isinstance(handle, _Run):
                handle.cancel(self.error)
            elif handle is not None and not handle.dispatch_ns and handle.mv.scheduler is not None:
                if handle.mv.scheduler.remove(lambda p, h=handle: p is h.pending):
                    self.b.control.release_regions(handle.regions)
                    self.active.pop(i, None)

    # ---------------------------------------------------------------- the answer

    def maybe_finish(self) -> None:
        if self.done or self.starting or self.active:
            return
        missing = [t for t in self.wanted if t not in self.tensors]
        if self.error is None and missing:
            self.error = P.Err("INTERNAL", f"ensemble '{self.mv.name}' produced no tensor '{missing[0]}'")
        self.done = True
        elapsed = time.monotonic_ns() - self.arrival_ns
        stats = self.mv.stats
        if self.error is not None:
            stats.record_failure(elapsed)
            self.ens.release(self.held)
            reply = P.InferReply(self.msg.rid, self.mv.version, error=self.error)
        else:
            reply = self.reply()
            stats.execution_count += 1
            stats.last_inference_ms = int(time.time() * 1000)
            stats.record_success(self.batch_size(), elapsed, 0, 0, 0, 0)
        self.b.control.release_regions(self.regions)
        self.b.send_reply(self.src, reply)

    def batch_size(self) -> int:
        first = self.msg.inputs[0].shape if self.msg.inputs else []
        return first[0] if self.mv.max_batch_size > 0 and first else 1

    def reply(self) -> P.InferReply:
        """The ensemble's outputs; their leases pass to whoever receives the reply."""
        outputs = []
        for name in self.wanted:
            d = self.tensors[name]
            spec = self.out_specs.get(name)
            if spec is not None and spec.seg:
                d = replace(d, region=spec.region, seg="", offset=0, lease=0)
            outputs.append(d)
        if isinstance(self.src, _StepReply):
            self.src.adopt(self.held, {d.name: self.owner_of[d.name] for d in outputs if d.lease})
            return P.InferReply(self.msg.rid, self.mv.version, outputs)
        units = {(self.owner_of[d.name], d.lease) for d in outputs if d.lease}
        held = Counter(self.held)
        held.subtract(units)
        self.ens.release(held.elements())
        owners = {o for o, _ in units}
        if len(owners) > 1:
            owner, numbers = self.ens.hand_over(sorted(units))
            outputs = [replace(d, lease=numbers[(self.owner_of[d.name], d.lease)]) if d.lease else d
                       for d in outputs]
        else:
            owner = next(iter(owners), b"")
        return P.InferReply(self.msg.rid, self.mv.version, outputs, None, owner)


# ---------------------------------------------------------------------- the broker's side

class Ensembles:
    """Loads ensembles after what they compose, runs their requests, and guards BLS calls."""

    def __init__(self, broker: "Broker") -> None:
        self.b = broker
        self.rids = itertools.count(1)
        self.handovers: dict[bytes, dict[int, tuple[bytes, int]]] = {}
        self.handover_ids = itertools.count(1)
        self.bls = BlsCalls(broker)

    # ---------------------------------------------------------------- loading

    def load_order(self, sources: dict[str, ModelSource], wanted: Iterable[str]) -> list[str]:
        """The wanted models plus every model their ensembles compose (transitively), each
        ensemble after the models it composes."""
        config_name = self.b.opts.get("model_config_name", "")
        deps: dict[str, list[str] | None] = {}
        todo = sorted(wanted, reverse=True)
        while todo:
            name = todo.pop()
            if name in deps or name not in sources:
                continue
            deps[name] = ensemble_dependencies(sources[name].path, config_name)
            todo.extend(reversed(deps[name] or []))
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

    def load_dependencies(self, sources: dict[str, ModelSource], name: str) -> None:
        """Explicit mode: loading an ensemble first loads what it composes that is not loaded."""
        for dep in self.load_order(sources, [name]):
            versions = self.b.models.get(dep) or {}
            if dep == name or any(mv.state in (READY, LOADING) for mv in versions.values()):
                continue
            if versions:
                self.b.control.unload(dep)
            self.b.load_model(sources[dep])

    def dependencies(self, name: str) -> list[str]:
        """Models a loaded ensemble composes, directly or through nested ensembles."""
        out: list[str] = []
        todo = [name]
        while todo:
            versions = self.b.models.get(todo.pop()) or {}
            for mv in versions.values():
                if isinstance(mv, EnsembleVersion):
                    for step in mv.plan.steps:
                        if step.model not in out and step.model != name:
                            out.append(step.model)
                            todo.append(step.model)
        return out

    def setup(self, spec: ModelSpec, version: int, config: dict) -> EnsembleVersion:
        """The table entry of one ensemble version, checked against the composing models' specs."""
        mv = EnsembleVersion(self.b, spec, version, config)
        error = validate_ensemble(spec.config, self.b.specs)
        if error:
            log.error("ensemble '%s' is UNAVAILABLE: %s", spec.name, error)
            mv.state, mv.reason = UNAVAILABLE, error
        else:
            mv.state = READY
        self.b.table_dirty = True
        return mv

    # ---------------------------------------------------------------- requests

    def run(self, src: Any, msg: P.Infer, mv: EnsembleVersion) -> "_Run | None":
        """Start an ensemble request (from a frontend, a BLS call or an enclosing ensemble);
        returns it while it is still in flight."""
        regions, err = self.b.control.resolve_regions(msg)
        if err is not None:
            self.b.reject(src, msg, err)
            return None
        run = _Run(self, src, msg, mv, regions)
        run.start()
        return None if run.done else run

    def on_gpu(self, step: Step) -> bool:
        """True when the model serving `step` runs only GPU instances, whose workers open device
        inputs in place (a nested ensemble is not looked into: it gets host memory)."""
        mv, err = self.b.resolve(step.model, step.version)
        if err is not None or isinstance(mv, EnsembleVersion) or not mv.instances:
            return False
        return all(inst.kind == "GPU" for inst in mv.instances)

    # ---------------------------------------------------------------- leases

    def release(self, units: Iterable[tuple[bytes, int]]) -> None:
        by_owner: dict[bytes, list[int]] = {}
        for owner, lease in units:
            by_owner.setdefault(owner, []).append(lease)
        for owner, leases in by_owner.items():
            self.b.route_release(P.Release(owner, leases))

    def hand_over(self, units: list[tuple[bytes, int]]) -> tuple[bytes, dict[tuple[bytes, int], int]]:
        """Outputs leased from several workers travel under one identity the receiver releases."""
        owner = b"ensemble:%d" % next(self.handover_ids)
        numbers = {unit: k for k, unit in enumerate(units, 1)}
        self.handovers[owner] = {k: unit for unit, k in numbers.items()}
        return owner, numbers

    def release_handover(self, msg: P.Release) -> bool:
        """Release what a receiver of a multi-worker ensemble reply is done with; False when
        `msg.owner` is not such an identity (then it names a worker)."""
        table = self.handovers.get(msg.owner)
        if table is None:
            return False
        self.release(table.pop(k) for k in msg.leases if k in table)
        if not table:
            del self.handovers[msg.owner]
        return True

    # ---------------------------------------------------------------- BLS

    def bls_call(self, src: tuple, msg: P.Infer, mv: ModelVersion) -> Callable | None:
        return self.bls.admit(src, msg, mv)


class BlsCalls:
    """The calls each worker is waiting on, and the deadlock check made before each new one."""

    def __init__(self, broker: "Broker") -> None:
        self.b = broker
        self.waits: dict[bytes, list[ModelVersion]] = {}

    def admit(self, src: tuple, msg: P.Infer, mv: ModelVersion) -> Callable | None:
        """The reply route for a BLS call, or None after refusing it."""
        sock, ident = src
        caller = self.b.by_identity.get(ident)
        if caller is None:
            return None
        if self.would_deadlock(caller, mv):
            caller_model = self.b.inst_model[id(caller)].name
            self.b.reject(src, msg, P.Err("UNAVAILABLE", (
                f"BLS request from model '{caller_model}' to model '{mv.name}' would deadlock: every instance "
                f"that could serve it is itself waiting, directly or through other calls, on this request's caller")))
            return None
        self.waits.setdefault(ident, []).append(mv)

        def reply(r: P.InferReply) -> None:
            waits = self.waits.get(ident)
            if waits is not None:
                waits.remove(mv)
                if not waits:
                    del self.waits[ident]
            if ident in self.b.by_identity:
                sock.send_multipart([ident, P.encode(r)])
            else:       # the caller died meanwhile: nobody will read these outputs
                leases = sorted({d.lease for d in r.outputs if d.lease})
                if leases:
                    self.b.route_release(P.Release(r.owner, leases))
        return reply

    def would_deadlock(self, caller: "Instance", target: ModelVersion) -> bool:
        """True when the caller, once waiting on `target`, could never be answered: the least
        fixpoint of "can make progress" (an instance not waiting on calls, or waiting only on
        models that can; a model with such an instance) leaves the caller out."""
        waits = {k: list(v) for k, v in self.waits.items()}
        waits.setdefault(caller.identity, []).append(target)
        versions = [mv for vs in self.b.models.values() for mv in vs.values() if mv.instances]
        moving: set[int] = set()          # id() of model versions that can make progress
        free: set[bytes] = set()          # identities of instances that can make progress

        def progresses(mv: ModelVersion, seen: frozenset = frozenset()) -> bool:
            if isinstance(mv, EnsembleVersion):
                if id(mv) in seen:
                    return False
                for step in mv.plan.steps:
                    _, _, sub = mv.composing(step)
                    if sub is None or not progresses(sub, seen | {id(mv)}):
                        return False
                return True
            return id(mv) in moving

        changed = True
        while changed:
            changed = False
            for mv in versions:
                for inst in mv.instances:
                    ident = inst.identity
                    if ident in free or inst.state not in _LIVE:
                        continue
                    if all(progresses(t) for t in waits.get(ident, ())):
                        free.add(ident)
                        changed = True
                if id(mv) not in moving and any(i.identity in free for i in mv.instances):
                    moving.add(id(mv))
                    changed = True
        return caller.identity not in free
