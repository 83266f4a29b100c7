"""The instance table: which worker identity, heartbeat identity and pidfd belong to which
instance, and which model version each instance serves.

A worker talks on three sockets (its main one, one for heartbeats named by `heartbeat_identity`
and one for a decoupled model's responses named by `stream_identity`); all resolve to the same
instance here and nowhere else. An identity
carries the worker's generation, so a frame from a dead incarnation finds nothing.
"""
from __future__ import annotations

from collections.abc import Iterator, KeysView
from typing import TYPE_CHECKING

from tritond.wire.schema import heartbeat_identity, stream_identity

from tritond.broker.supervision.pool import Instance

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion


class InstanceTable:
    def __init__(self) -> None:
        self._by_identity: dict[bytes, Instance] = {}
        self._workers: dict[bytes, Instance] = {}      # main identities only
        self._by_pidfd: dict[int, Instance] = {}
        self._model: dict[Instance, "ModelVersion"] = {}
        self.fds_changed = False        # the broker's loop re-registers the pidfds then

    def add(self, inst: Instance, mv: "ModelVersion") -> None:
        """Register the current generation of `inst` (after it was spawned)."""
        self._by_identity[inst.identity] = inst
        self._by_identity[heartbeat_identity(inst.identity)] = inst
        self._by_identity[stream_identity(inst.identity)] = inst
        self._workers[inst.identity] = inst
        self._by_pidfd[inst.pidfd] = inst
        self.fds_changed = True
        self._model[inst] = mv

    def forget(self, inst: Instance) -> None:
        """Drop the identities, pidfd and model of `inst`'s current generation (it died, or
        a new generation replaces it)."""
        for ident in (inst.identity, heartbeat_identity(inst.identity), stream_identity(inst.identity)):
            if self._by_identity.get(ident) is inst:
                del self._by_identity[ident]
        if self._workers.get(inst.identity) is inst:
            del self._workers[inst.identity]
        if self._by_pidfd.get(inst.pidfd) is inst:
            del self._by_pidfd[inst.pidfd]
            self.fds_changed = True
        self._model.pop(inst, None)

    def get(self, identity: bytes) -> Instance | None:
        """The instance speaking on `identity` (main or heartbeat socket), if it is current."""
        return self._by_identity.get(identity)

    def is_worker(self, identity: bytes) -> bool:
        """True for the main identity of a current worker (replies go there)."""
        return identity in self._workers

    def model_of(self, inst: Instance) -> "ModelVersion":
        return self._model[inst]

    def by_pidfd(self, fd: int) -> Instance | None:
        return self._by_pidfd.get(fd)

    def spawned(self) -> list[Instance]:
        """Every instance whose worker process was started and not yet reaped."""
        return list(self._by_pidfd.values())

    def pidfds(self) -> KeysView[int]:
        """A live view, no copy."""
        return self._by_pidfd.keys()

    def worker_identities(self) -> Iterator[bytes]:
        return iter(list(self._workers))
