"""One ensemble request in flight inside the broker.

The runner walks the ensemble's steps: a step becomes an ordinary request to its composing
model's scheduler (so dynamic batching applies across ensemble requests) as soon as every
tensor it reads exists, and independent steps run at the same time. Tensors move between
steps as descriptors, never as bytes: an intermediate stays in the producing worker's arena
under a lease the runner holds until the ensemble request is answered, then releases (also on
every error path). An intermediate that only GPU instances read may stay in the producer's
device memory (`OutputSpec.device_ok`); what the runner answers with is always in host memory
unless its own requester accepts device memory.

A decoupled step streams: its responses that carry only ensemble outputs go on to the requester
as they come; when its outputs feed other steps, each response runs those steps in a branch of
its own (a run holding the tensors of that moment plus the response's), and what a branch
produces goes to the requester as one more response, as Triton runs them.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import msgspec

from tritond.wire.errors import Code, TritonError
from tritond.wire.schema import Block, Device, Infer, InferReply, OutputSpec, TensorDesc, lease_of

from tritond.broker.tables.client_regions import ClientRegions
from tritond.broker.clock import Clock
from tritond.broker.ensembles.plan import EnsembleVersion, Step
from tritond.broker.scheduling.sequence_slots import FLAG_END, FLAG_START
from tritond.broker.tables.inflight import ReplyTo, Req
from tritond.broker.tables.model_version import ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")

GATED = object()        # in EnsembleRun.active: the step waits at its ensemble's gate
_ENDED = object()

replace = msgspec.structs.replace


class Runner(Protocol):
    """What a run needs of the broker's ensemble side (broker/ensembles/submission.py)."""
    registry: ModelRegistry
    regions: ClientRegions
    clock: Clock
    rids: Iterator[int]
    tracer: Any
    cache: Any

    def submit(self, reply: ReplyTo, msg: Infer, mv: ModelVersion, trace: Any = None) -> Any: ...
    def cancel_running(self, req: Req) -> None: ...
    def on_gpu(self, step: Step) -> bool: ...
    def release(self, units: Iterable[tuple[bytes, int]]) -> None: ...
    def hand_over(self, units: list[tuple[bytes, int]]) -> tuple[bytes, dict[tuple[bytes, int], int]]: ...


def unleased(desc: TensorDesc, name: str) -> TensorDesc:
    """`desc` under another name, without its lease (the runner keeps holding that)."""
    loc = desc.loc
    if isinstance(loc, (Block, Device)) and loc.lease:
        loc = replace(loc, lease=0)
    return TensorDesc(name, desc.datatype, desc.shape, loc)


def with_lease(desc: TensorDesc, lease: int) -> TensorDesc:
    return TensorDesc(desc.name, desc.datatype, desc.shape, replace(desc.loc, lease=lease))


class StepReply:
    """The reply callable of one step.

    A nested ensemble answering a step hands its leases over through `adopt` and names the
    worker behind each output in `owners`, since its reply has no single owner."""
    __slots__ = ("run", "index", "owners")

    def __init__(self, run: "EnsembleRun", index: int) -> None:
        self.run = run
        self.index = index
        self.owners: dict[str, bytes] | None = None

    def __call__(self, reply: InferReply) -> None:
        self.run.on_step_reply(self.index, reply, self.owners)

    def adopt(self, units: list[tuple[bytes, int]], owners: dict[str, bytes]) -> None:
        self.run.held.extend(units)
        self.owners = owners


class BranchReply:
    """The reply callable of a branch: its parent passes what it produced on."""
    __slots__ = ("parent", "branch")

    def __init__(self, parent: "EnsembleRun") -> None:
        self.parent = parent
        self.branch: EnsembleRun | None = None

    def __call__(self, reply: InferReply) -> None:
        self.parent.on_branch_reply(self.branch, reply)


class EnsembleRun:
    """The tensors that exist, the steps still waiting, the steps queued or executing, and
    every lease held on intermediates."""

    def __init__(self, ens: Runner, reply_to: ReplyTo, msg: Infer, mv: EnsembleVersion,
                 regions: list, now_ns: int, trace: Any = None) -> None:
        self.ens = ens
        self.reply_to = reply_to
        self.msg = msg
        self.mv = mv
        self.plan = plan = mv.plan
        self.regions = regions
        self.arrival_ns = now_ns
        self.out_specs = {o.name: o for o in msg.outputs}
        self.wanted = tuple(o.name for o in msg.outputs) or tuple(plan.outputs)
        self.planned, self.needed = plan.needed(self.wanted)
        self.run_step = list(self.planned)
        self.tensors: dict[str, TensorDesc] = {d.name: plan.step_view(d) for d in msg.inputs}
        self.owner_of: dict[str, bytes] = {}
        self.absent: set[str] = set()         # step outputs the model did not produce
        present = set(self.tensors) | (set(plan.inputs) - set(self.tensors))  # absent optional inputs
        self.waiting = [sum(1 for t in dict.fromkeys(s.inputs.values()) if t not in present) for s in plan.steps]
        self.started = [False] * len(plan.steps)
        self.started_ns = [0] * len(plan.steps)
        self.active: dict[int, Any] = {}      # step -> its Req (queued or executing), nested run or GATED
        self.streaming: set[int] = set()      # steps of decoupled models: each response is passed on
        self.fanned: dict[int, frozenset[int]] = {}   # streaming step -> the steps each response runs
        self.by_branches: set[str] = set()    # tensors only branches make
        self.branches: list[EnsembleRun] = []     # branches still running
        self.is_branch = False
        self.responded = False                # the first-response histogram times the first answer only
        self.held: list[tuple[bytes, int]] = []
        self.error: TritonError | None = None
        self.done = False
        self.starting = False
        self.trace = trace                    # when the request is traced: its steps' requests are too
        self.step_traces: dict[int, Any] = {}

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
        self.started[i] = True
        gate = self.mv.gate
        if gate is not None and not gate.admit(self, i):
            self.active[i] = GATED
            return
        self.launch(i)

    def gated_start(self, i: int) -> bool:
        """The gate's turn for step `i`, which waited for one of its requests to end."""
        if self.active.get(i) is not GATED:
            return False
        del self.active[i]
        self.launch(i)
        self.maybe_finish()
        return True

    def step_ended(self, i: int) -> None:
        """Step `i`'s request (or its wait at the gate) is over."""
        handle = self.active.pop(i, _ENDED)
        gate = self.mv.gate
        if gate is not None and handle is not _ENDED:
            if handle is GATED:
                gate.forget(self, i)
            else:
                gate.leave(i)

    def launch(self, i: int) -> None:
        step = self.plan.steps[i]
        self.started_ns[i] = self.ens.clock.now_ns()
        try:
            mv = self.ens.registry.resolve(step.model, step.version, restarting_ok=True)
        except TritonError as e:
            if self.mv.gate is not None:
                self.mv.gate.leave(i)
            self.fail(step, e)
            return
        inputs = [unleased(self.tensors[t], model_input) for model_input, t in step.inputs.items() if t in self.tensors]
        outputs = [self.output_spec(model_output, t) for model_output, t in step.outputs.items() if t in self.needed]
        m = self.msg
        infer = Infer(next(self.ens.rids), step.model, mv.version, inputs, outputs, m.id, m.params,
                      m.priority, m.timeout_us, m.correlation_id, m.flags)
        if mv.view.decoupled:
            self.streaming.add(i)
            below = frozenset(j for j in self.plan.downstream(i) if self.run_step[j])
            if below:           # each response runs these in a branch, never this run itself
                self.fanned[i] = below
                for j in below:
                    self.run_step[j] = False
                    self.by_branches.update(self.plan.steps[j].outputs.values())
        self.active[i] = None
        child = self.ens.tracer.child(self.trace, mv) if self.trace is not None else None
        if child is not None:
            self.step_traces[i] = child
        reply: Any = StepReply(self, i)
        if mv.view.response_cache and not isinstance(mv, EnsembleVersion) and all(o.region is None for o in outputs):
            reply = self.ens.cache.step_lookup(reply, infer, mv)
            if reply is None:
                return          # answered from the response cache
        handle = self.ens.submit(reply, infer, mv, child)
        if i in self.active:        # not answered synchronously
            self.active[i] = handle

    def output_spec(self, model_output: str, tensor: str) -> OutputSpec:
        """A step output that is a requested ensemble output in a client region goes straight there."""
        o = self.out_specs.get(tensor)
        if o is not None and o.region is not None:
            return OutputSpec(model_output, region=o.region)
        return OutputSpec(model_output, device_ok=self.device_ok(tensor))

    def device_ok(self, tensor: str) -> bool:
        """Whether `tensor` may stay in its producer's device memory: every step of this request
        reading it runs on GPU instances, and it is not part of the answer (unless the requester,
        an enclosing ensemble, takes device memory for it too)."""
        if tensor in self.wanted:
            spec = self.out_specs.get(tensor)
            if spec is None or not spec.device_ok:
                return False
        steps = self.plan.steps
        return all(self.ens.on_gpu(steps[j]) for j in self.plan.consumers.get(tensor, ()) if self.planned[j])

    def on_step_reply(self, i: int, reply: InferReply, owners: dict[str, bytes] | None) -> None:
        if self.step_traces and not (reply.more and i in self.streaming) and i in self.step_traces:
            self.ens.tracer.end_child(self.step_traces.pop(i))
        if i in self.streaming:
            self.on_streamed(i, reply)
            return
        self.step_ended(i)
        if owners is None:
            self.held.extend((reply.owner, lease) for lease in {lease_of(d) for d in reply.outputs} if lease)
        step = self.plan.steps[i]
        if reply.error is not None:
            self.step_failed(i)
        if self.error is None and not self.done:
            if reply.error is not None:
                self.fail(step, reply.error)
            else:
                self.accept(step, reply, owners)
        self.maybe_finish()

    def on_streamed(self, i: int, reply: InferReply) -> None:
        """A response of a decoupled step: one that feeds other steps starts a branch that
        takes its leases; one of ensemble outputs only goes on to the requester at once, its
        leases with it."""
        if not reply.more:
            self.step_ended(i)
        step = self.plan.steps[i]
        forwarded = False
        if reply.error is not None:
            self.step_failed(i)
            self.fail(step, reply.error)
        elif i in self.fanned:
            if not reply.empty and self.error is None and not self.done:
                self.branch(i, reply)
                forwarded = True
        elif not reply.empty and self.error is None and not self.done:
            by_name = {d.name: d for d in reply.outputs}
            outputs = [self.plan.client_view(TensorDesc(t, d.datatype, d.shape, d.loc))
                       for o, t in step.outputs.items() if t in self.wanted and (d := by_name.get(o)) is not None]
            self.first_response()
            self.reply_to(InferReply(self.msg.rid, self.mv.version, outputs, None, reply.owner, more=True,
                                     parameters=self.sequence_parameters()))
            forwarded = True
        if not forwarded:
            self.ens.release((reply.owner, lease) for lease in {lease_of(d) for d in reply.outputs} if lease)
        self.maybe_finish()

    def branch(self, i: int, reply: InferReply) -> None:
        """Run the steps below streaming step `i` for this one response of it, in a run of their
        own that holds the response's leases; the tensors made so far are read, not held."""
        step = self.plan.steps[i]
        b = EnsembleRun(self.ens, BranchReply(self), self.msg, self.mv, [], self.arrival_ns)
        b.reply_to.branch = b
        b.is_branch = True
        b.tensors = dict(self.tensors)
        b.owner_of = dict(self.owner_of)
        b.absent = set(self.absent)
        below = self.fanned[i]
        made = {t for j in below for t in self.plan.steps[j].outputs.values()} | set(step.outputs.values())
        b.wanted = tuple(t for t in self.wanted if t in made)
        b.needed = self.needed
        b.planned = tuple(j in below for j in range(len(self.plan.steps)))
        b.run_step = list(b.planned)
        b.started = [not run for run in b.planned]
        b.held = [(reply.owner, lease) for lease in {lease_of(d) for d in reply.outputs} if lease]
        by_name = {d.name: d for d in reply.outputs}
        for model_output, tensor in step.outputs.items():
            d = by_name.get(model_output)
            if d is None:
                b.absent.add(tensor)
            else:
                b.tensors[tensor] = TensorDesc(tensor, d.datatype, d.shape, d.loc)
                b.owner_of[tensor] = reply.owner
        present = set(b.tensors) | b.absent | (set(self.plan.inputs) - {d.name for d in self.msg.inputs})
        b.waiting = [sum(1 for t in dict.fromkeys(s.inputs.values()) if t not in present) for s in self.plan.steps]
        for j in below:
            late = [t for t in self.plan.steps[j].inputs.values() if t not in present and t not in made]
            if late:
                b.error = TritonError(Code.UNAVAILABLE, (
                    f"in ensemble '{self.mv.name}', {self.plan.steps[j].label()} reads '{late[0]}', which was not "
                    f"made yet when {step.label()} responded; tritond runs the steps after a decoupled step "
                    f"with what exists at each of its responses"))
        self.branches.append(b)
        b.start()

    def on_branch_reply(self, b: "EnsembleRun", reply: InferReply) -> None:
        """What a branch made goes on to the requester as one more response, the last one (with
        the final flag, as Triton sends it) when nothing else of this run is left; a branch's
        end may end this run. A branch's error fails the request."""
        leases = [(reply.owner, lease) for lease in {lease_of(d) for d in reply.outputs} if lease]
        if not reply.more:
            self.branches.remove(b)
        if reply.error is not None:
            if self.error is None and not self.done:
                self.error = reply.error
                self.cancel_queued()
        elif reply.outputs and self.error is None and not self.done:
            self.first_response()
            last = not (reply.more or self.branches or self.active or self.starting)
            if last:
                self.done = True
                self.mv.stats.record_ensemble(self.batch_size(), self.ens.clock.now_ns() - self.arrival_ns)
                self.ens.release(self.held)
                self.ens.regions.release(self.regions)
            self.reply_to(InferReply(self.msg.rid, self.mv.version, reply.outputs, None, reply.owner, more=not last,
                                     parameters=self.sequence_parameters()))
            leases = []
        if leases:
            self.ens.release(leases)
        if not reply.more:
            self.maybe_finish()

    def accept(self, step: Step, reply: InferReply, owners: dict[str, bytes] | None) -> None:
        by_name = {d.name: d for d in reply.outputs}
        produced = []
        for model_output, tensor in step.outputs.items():
            if tensor not in self.needed:
                continue
            d = by_name.get(model_output)
            if d is None:
                # As Triton: an empty placeholder, so a step taking it as an optional input still runs
                # (without it) and an ensemble output left unmade is left out of the answer.
                self.absent.add(tensor)
                produced.append(tensor)
                continue
            self.tensors[tensor] = TensorDesc(tensor, d.datatype, d.shape, d.loc)
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

    def step_failed(self, i: int) -> None:
        """As Triton counts it, a failed request of a composing model is a failure of the ensemble
        too (reason OTHER), besides the ensemble request's own failure."""
        self.mv.stats.record_failure(self.ens.clock.now_ns() - self.started_ns[i])

    def fail(self, step: Step, err: TritonError) -> None:
        if self.error is not None:
            return
        self.error = TritonError(err.code, f"in ensemble '{self.mv.name}', {step.label()} failed: {err.message}")
        self.cancel_queued()

    def cancel(self, err: TritonError) -> None:
        """Fail this request (a sibling step of an enclosing ensemble failed)."""
        if self.error is None and not self.done:
            self.error = err
            self.cancel_queued()
            self.maybe_finish()

    def cancel_queued(self) -> None:
        """Take not yet dispatched steps out of their queues (a branch's too); executing ones
        finish on their own."""
        for b in list(self.branches):
            b.cancel(self.error)
        for i, handle in list(self.active.items()):
            if handle is GATED:
                self.step_ended(i)
            elif isinstance(handle, EnsembleRun):
                handle.cancel(self.error)
            elif isinstance(handle, Req) and handle.dispatch_ns:
                self.ens.cancel_running(handle)
            elif isinstance(handle, Req) and handle.mv.scheduler is not None:
                if handle.mv.scheduler.remove(lambda p, h=handle: p is h.pending):
                    self.ens.regions.release(handle.regions)
                    self.step_ended(i)

    # ---------------------------------------------------------------- the answer

    def maybe_finish(self) -> None:
        if self.done or self.starting or self.active or self.branches:
            return
        streams = {t for j in self.streaming for t in self.plan.steps[j].outputs.values()} | self.by_branches
        missing = [t for t in self.wanted if t not in self.tensors and t not in streams and t not in self.absent]
        if self.error is None and missing:
            self.error = TritonError(Code.INTERNAL, f"ensemble '{self.mv.name}' produced no tensor '{missing[0]}'")
        self.done = True
        if self.is_branch:          # its parent counts the request and answers it
            self.reply_to(self.reply() if self.error is None else self.failed())
            return
        elapsed = self.ens.clock.now_ns() - self.arrival_ns
        stats = self.mv.stats
        if self.error is not None:
            stats.record_failure(elapsed)
            reply = self.failed()
        else:
            reply = self.reply()
            self.first_response()
            stats.record_ensemble(self.batch_size(), elapsed)
        self.ens.regions.release(self.regions)
        self.reply_to(reply)

    def first_response(self) -> None:
        """Time this request's first answer to the requester (a branch's parent answers)."""
        if self.responded or self.is_branch:
            return
        self.responded = True
        if self.mv.stats.latency is not None:
            self.mv.stats.latency.first_response_ms((self.ens.clock.now_ns() - self.arrival_ns) // 1_000_000)

    def failed(self) -> InferReply:
        self.ens.release(self.held)
        return InferReply(self.msg.rid, self.mv.version, error=self.error)

    def batch_size(self) -> int:
        first = self.msg.inputs[0].shape if self.msg.inputs else []
        return first[0] if self.mv.max_batch_size > 0 and first else 1

    def reply(self) -> InferReply:
        """The ensemble's outputs; their leases pass to whoever receives the reply. What went out
        in streamed replies is not repeated; with nothing left the reply only ends the request."""
        outputs = [self.plan.client_view(self.tensors[name]) for name in self.wanted if name in self.tensors]
        for name in self.wanted:
            if name in self.absent:
                log.debug("Composing models did not output tensor %s", name)
        if self.streaming and not outputs:
            self.ens.release(self.held)
            return InferReply(self.msg.rid, self.mv.version, empty=True)
        if isinstance(self.reply_to, StepReply):
            self.reply_to.adopt(self.held, {d.name: self.owner_of[d.name] for d in outputs if lease_of(d)})
            return InferReply(self.msg.rid, self.mv.version, outputs)
        parameters = self.sequence_parameters() if any(d.name in self.owner_of for d in outputs) else {}
        units = {(self.owner_of[d.name], lease_of(d)) for d in outputs if lease_of(d)}
        held = Counter(self.held)
        held.subtract(units)
        self.ens.release(held.elements())
        owners = {o for o, _ in units}
        if len(owners) > 1:
            owner, numbers = self.ens.hand_over(sorted(units))
            outputs = [with_lease(d, numbers[(self.owner_of[d.name], lease_of(d))]) if lease_of(d) else d
                       for d in outputs]
        else:
            owner = next(iter(owners), b"")
        return InferReply(self.msg.rid, self.mv.version, outputs, None, owner, parameters=parameters)

    def sequence_parameters(self) -> dict[str, int | str | bool]:
        """As Triton: a response made of step outputs carries the request's sequence id and flags."""
        return {"sequence_id": self.msg.correlation_id, "sequence_start": bool(self.msg.flags & FLAG_START),
                "sequence_end": bool(self.msg.flags & FLAG_END)}
