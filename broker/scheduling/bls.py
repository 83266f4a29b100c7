"""BLS calls: a Python model calling another model through the broker while it executes.

The calls each worker is waiting on are recorded, and before a new call is queued the broker
checks that some instance able to serve it is not itself waiting, directly or through other
calls, on the caller: such a call would wait forever, so it is refused instead.
"""
from __future__ import annotations

from collections.abc import Callable

from tritond.wire.errors import unavailable
from tritond.wire.schema import Infer, InferReply, Release, lease_of

from tritond.broker.ensembles.plan import EnsembleVersion
from tritond.broker.tables.inflight import ReplyTo
from tritond.broker.tables.instances import InstanceTable
from tritond.broker.tables.model_version import ModelVersion
from tritond.broker.supervision.pool import Instance, InstanceState
from tritond.broker.tables.registry import ModelRegistry

# Instance states from which an instance will (again) take work from its queue.
_LIVE = (InstanceState.READY, InstanceState.BUSY, InstanceState.STARTING, InstanceState.RESTARTING)


class BlsCalls:
    def __init__(self, registry: ModelRegistry, instances: InstanceTable,
                 send_worker: Callable[[bytes, InferReply], None],
                 route_release: Callable[[Release], None]) -> None:
        self.registry = registry
        self.instances = instances
        self._send_worker = send_worker
        self._route_release = route_release
        self.waits: dict[bytes, list[ModelVersion]] = {}

    def admit(self, caller_identity: bytes, msg: Infer, mv: ModelVersion) -> ReplyTo | None:
        """The reply route for a BLS call, or None after refusing (and answering) it."""
        caller = self.instances.get(caller_identity)
        if caller is None or not self.instances.is_worker(caller_identity):
            return None
        if self.would_deadlock(caller, mv):
            caller_model = self.instances.model_of(caller).name
            self._send_worker(caller_identity, InferReply(msg.rid, error=unavailable(
                f"BLS request from model '{caller_model}' to model '{mv.name}' would deadlock: every instance "
                f"that could serve it is itself waiting, directly or through other calls, on this request's caller")))
            return None
        self.waits.setdefault(caller_identity, []).append(mv)

        def reply(r: InferReply) -> None:
            waits = self.waits.get(caller_identity)
            if waits is not None and not r.more:       # a decoupled callee's last reply ends the wait
                waits.remove(mv)
                if not waits:
                    del self.waits[caller_identity]
            if self.instances.is_worker(caller_identity):
                self._send_worker(caller_identity, r)
            else:       # the caller died meanwhile: nobody will read these outputs
                leases = sorted({lease_of(d) for d in r.outputs} - {0})
                if leases:
                    self._route_release(Release(r.owner, leases))
        return reply

    def would_deadlock(self, caller: Instance, target: ModelVersion) -> bool:
        """True when the caller, once waiting on `target`, could never be answered: the least
        fixpoint of "can make progress" (an instance not waiting on calls, or waiting only on
        models that can; a model with such an instance) leaves the caller out."""
        waits = {k: list(v) for k, v in self.waits.items()}
        waits.setdefault(caller.identity, []).append(target)
        versions = [mv for mv in self.registry.versions() if mv.instances]
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
