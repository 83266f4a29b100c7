"""The model registry: every model version the broker knows, their states, and the table
it publishes to the frontends (which validate requests against it)."""
from __future__ import annotations

import logging
from collections.abc import Iterator

from tritond.repository.spec import ModelSpec
from tritond.wire.schema import ModelEntry, ModelState, Table
from tritond.wire.versions import resolve

from tritond.broker.tables.model_version import READY, UNAVAILABLE, ModelVersion

log = logging.getLogger("tritond.broker")


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.names: list[str] = []                 # every model in the repositories, loaded or not
        self.specs: dict[str, ModelSpec] = {}      # the last spec loaded for each model
        self.epoch = 0
        self.dirty = True                          # the published table is out of date
        self.startup_done = False
        self.loading: list[ModelVersion] = []      # staged by a reload, not in the table yet
        self.retiring: list[ModelVersion] = []     # left service, draining (retire.py)
        # versions a reload dropped from a model's entry: the repository index lists them
        # UNAVAILABLE "unloaded", as Triton does, until they come back
        self.dropped: dict[str, set[int]] = {}

    def get(self, name: str) -> dict[int, ModelVersion]:
        return self.models.get(name) or {}

    def versions(self) -> Iterator[ModelVersion]:
        for versions in self.models.values():
            yield from versions.values()

    def all_versions(self) -> Iterator[ModelVersion]:
        """Every version with workers to watch: in the table, staged by a reload, or retiring
        (an unloaded version stays in the table while it retires: it is yielded once)."""
        yield from self.versions()
        yield from self.loading
        for mv in self.retiring:
            if self.models.get(mv.name, {}).get(mv.version) is not mv:
                yield mv

    def set_names(self, names: list[str]) -> None:
        if names != self.names:
            self.names = names
            self.dirty = True

    def replace(self, name: str, versions: dict[int, ModelVersion]) -> None:
        self.models[name] = versions
        self.dirty = True

    def resolve(self, name: str, version: int, restarting_ok: bool = False) -> ModelVersion:
        """Triton's lookup; raises TritonError with Triton's texts. With `restarting_ok` (an
        inference), a version whose instances are restarting is found too: requests queue."""
        versions = self.models.get(name)
        if versions is not None and version < 0 and len(versions) == 1:
            for mv in versions.values():        # one version, ready: the common request
                if mv.state is READY:
                    return mv
        return resolve(name, version, versions, versions is None and name in self.names, restarting_ok)

    # ---------------------------------------------------------------- states

    def set_state(self, mv: ModelVersion, state: ModelState, reason: str = "") -> None:
        if mv.state != state or mv.reason != reason:
            mv.state, mv.reason = state, reason
            self.dirty = True
            if state == UNAVAILABLE and reason and not mv.unloaded:
                log.error("model '%s' version %d is UNAVAILABLE: %s", mv.name, mv.version, reason)
            elif state == READY:
                log.info("model '%s' version %d is READY", mv.name, mv.version)

    def idle(self) -> bool:
        """No request queued anywhere."""
        return all(mv.scheduler is None or not len(mv.scheduler) for mv in self.all_versions())

    # ---------------------------------------------------------------- the published table

    def table(self, stopping: bool, boot: int) -> Table:
        entries = [ModelEntry(mv.name, mv.version, mv.state, mv.reason, mv.unloaded,
                              mv.view if mv.config is not None else None, mv.config, mv.restarting,
                              any(i.ready_hook for i in mv.instances))
                   for mv in self.versions()]
        return Table(self.epoch, entries, self.names, self.startup_done, stopping, boot)

    def publish(self, stopping: bool, boot: int) -> Table:
        """The next epoch of the table; the caller sends it to every frontend."""
        self.epoch += 1
        self.dirty = False
        return self.table(stopping, boot)
