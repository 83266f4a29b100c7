"""The host's thread budget, decided when a model version loads (never per request).

Each CPU instance gets its share of the server's usable cores among the CPU instances of
every loaded model (repository/threads.py has the arithmetic and the parameters that
override it). Counted: every version in the table or staged by a reload whose instances are
not gone (FAILED, STOPPED; a version restarting its instances counts), except those retiring
or unloaded and the versions of the model being loaded that it replaces; during the startup
load also the models of the repository not loaded yet (`plan`), so the first model does not
take every core. A version keeps what it got (its restarted workers too) until it is loaded
again: a model loaded later takes its share of what the count says then, and earlier models
keep theirs. One log line per instance says what it got and why.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from tritond.repository.spec import ModelSpec
from tritond.repository.threads import ThreadChoice, choose_threads, config_cpu_instance_count, usable_cores

from tritond.broker.supervision.pool import InstanceState
from tritond.broker.tables.model_version import LOADING, READY, ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")

_GONE = (InstanceState.FAILED, InstanceState.STOPPED)


def cpu_instances(mv: ModelVersion) -> int:
    return sum(1 for i in mv.instances if i.kind == "CPU" and i.state not in _GONE)


class ThreadBudget:
    def __init__(self, cores: int | None = None, reserved: int = 0) -> None:
        self.cores = cores or usable_cores()
        self.reserved = reserved        # cores the broker and the frontend processes keep busy
        self.planned: dict[str, int] = {}      # startup: CPU instances of models not loaded yet

    def plan(self, specs: Iterable[ModelSpec]) -> None:
        """The startup load's models, before any of them starts a worker."""
        for spec in specs:
            if spec.config is not None and not spec.error:
                self.planned[spec.name] = config_cpu_instance_count(spec.config) * len(spec.versions)

    def done(self, name: str) -> None:
        """`name` is loaded (or failed): its planned instances are counted from the table now."""
        self.planned.pop(name, None)

    def others(self, registry: ModelRegistry, name: str) -> int:
        """CPU instances of every model but `name`, loaded, loading or planned."""
        live: dict[str, int] = {}
        for mv in [*registry.versions(), *registry.loading]:
            if mv.name == name or mv.unloaded or mv.retiring or (mv.state not in (LOADING, READY)
                                                                 and not mv.restarting):
                continue
            live[mv.name] = live.get(mv.name, 0) + cpu_instances(mv)
        planned = sum(n for m, n in self.planned.items() if m != name and m not in live)
        return sum(live.values()) + planned

    def assign(self, registry: ModelRegistry, staged: list[ModelVersion], kept: list[ModelVersion]) -> None:
        """Decide the threads of `staged`'s instances (new versions of one model; `kept` are its
        versions that stay) and log one line per instance."""
        if not staged:
            return
        name = staged[0].name
        total = self.others(registry, name) + sum(cpu_instances(mv) for mv in [*staged, *kept])
        for mv in staged:
            for inst in mv.instances:
                choice = choose_threads(mv.config or {}, inst.kind, self.cores, total, self.reserved)
                mv.threads[inst.index] = choice
                log.info("model '%s' version %d instance '%s': %s (%s)", mv.name, mv.version, inst.name,
                         describe(choice), choice.why)
        self.done(name)


def describe(choice: ThreadChoice) -> str:
    if not choice.threads:
        return "threads not budgeted"
    inter = f", {choice.inter_op_threads} inter-op" if choice.inter_op_threads != choice.threads else ""
    return f"{choice.threads} thread(s){inter}"
