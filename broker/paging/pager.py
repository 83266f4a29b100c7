"""Model paging (--model-control-mode=paged): every model of the repository is in the table from
the start, most of them paged out; an inference for a paged-out model queues on it and pages it
in; a page-in that would exceed --model-memory-budget first pages out the least recently used
resident models that have nothing queued or executing.

A paged-out version is an ordinary table entry that is UNAVAILABLE and `restarting` (so
frontends pass its requests to the broker, which queues them, as for a model whose workers
restart), with its scheduler and instances made but no worker. Paging in starts its workers
with the version LOADING; the lifecycle makes it READY when they are up, and its queue then
runs. Paging out puts a fresh paged-out version in the table (its statistics carried over) and
retires the resident one (lifecycle/retire.py), whose memory counts until its workers exited.

The budget is the whole server's memory: the pageable models' workers plus the server's own
processes (supervisor, broker, frontends, warm templates and their spares) and the pinned
models' workers, all as PSS measured on the job pool every MEASURE_S and after every page-in and
its first answer, never file sizes. A page-in starts once the workers paged out for it have
exited, so their memory and its own are never counted twice. A model measured bigger than what
the budget leaves beside the rest of the server is refused; when a load fails, what waited for
it fails with the reason and the model is not tried again before its backoff ends. Pinned models
(--load-model, parameter `paging_pinned`, ensembles and what they compose) are loaded at startup
by model control; the pager only counts their memory.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritond.repository.spec import ModelSpec
from tritond.wire import replies as R
from tritond.wire.errors import TritonError, unavailable

from tritond.broker.clock import Clock
from tritond.broker.lifecycle.jobs import Jobs
from tritond.broker.lifecycle.version_state import Lifecycle, instances_of
from tritond.broker.observe.metrics import Summary
from tritond.broker.paging.budget import HOST, Candidate, Devices, Sizes, backoff_s, victims
from tritond.broker.paging.device_memory import DeviceMemory, processes_on
from tritond.broker.paging.memory import models_pss, pss_bytes
from tritond.broker.scheduling.factory import new_scheduling
from tritond.broker.supervision.pool import InstanceState
from tritond.broker.tables.model_version import LOADING, READY, UNAVAILABLE, ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")

MEASURE_S = 1.0         # every process of the server measured this often (a page-in at once)
PAGED_OUT = "paged out: loads on its next request"
OUT, LOADING_IN, IN = "out", "loading", "in"
_IDLE = (InstanceState.READY,)


@dataclass(eq=False)
class Paged:
    """One pageable model: where it is and what paging it cost."""
    name: str
    spec: ModelSpec
    config: dict[str, Any]
    phase: str = OUT
    last_used: float = 0.0           # wall-clock seconds of its page-in (its executions count too)
    asked_ns: int = 0                # when the request that paged it in arrived
    executions: int = 0              # its execution count when its page-in began
    page_ins: int = 0
    page_outs: int = 0
    first_response: Summary = field(default_factory=Summary)     # µs from the request to its answer
    failures: int = 0                # loads failed in a row
    retry_at: float = 0.0            # clock time before which it is not loaded again
    failure: str = ""
    gpus: frozenset[int] = frozenset()      # the GPUs its instances run on


class Pager:
    def __init__(self, budget: int, registry: ModelRegistry, lifecycle: Lifecycle, jobs: Jobs, clock: Clock,
                 retire: Callable[[ModelVersion], None], server_pids: Callable[[], set[int]],
                 gpu_budgets: dict[int, int]) -> None:
        self.budget = budget
        self.devices = Devices(gpu_budgets)
        self.device_memory = DeviceMemory(gpu_budgets) if gpu_budgets else None
        self.registry = registry
        self.lifecycle = lifecycle
        self.requests = lifecycle.requests
        self.jobs = jobs
        self.clock = clock
        self._retire = retire
        self.server_pids = server_pids        # the server's own processes: supervisor, broker, frontends, templates...
        self.models: dict[str, Paged] = {}
        self.active: dict[str, Paged] = {}       # loading or resident
        self.loading: dict[str, Paged] = {}      # paging in: looked at each turn
        self.first: dict[str, Paged] = {}        # paged in, first answer not seen yet: looked at each turn
        self.sizes = Sizes()
        self.wanted: list[str] = []          # paged-out models asked for, in order of asking
        self.exiting: list[tuple[ModelVersion, dict]] = []   # paged out, workers not gone yet: what they held
        self.first_response = Summary()      # every page-in's, µs
        self.base = 0                        # bytes the server's own processes and pinned models use (measured)
        self.next_measure = 0.0
        self.measuring = False
        self.fresh: set[str] = set()         # paged in or first answered since measured: measured at once
        self._lookup = registry.resolve
        registry.resolve = self.resolve      # type: ignore[method-assign]   # decided at startup

    # ---------------------------------------------------------------- the table

    def add(self, spec: ModelSpec, config: dict[str, Any]) -> None:
        """A model paged out from the start: in the table, UNAVAILABLE, no worker."""
        gpus = frozenset(i.device_id for i in instances_of(spec.name, 0, config) if i.kind == "GPU")
        rec = Paged(spec.name, spec, config, gpus=gpus)
        self.models[spec.name] = rec
        self.registry.specs[spec.name] = spec
        self.registry.replace(spec.name, {v: self._paged_out(rec, v, None) for v in spec.versions})

    def _paged_out(self, rec: Paged, version: int, old: ModelVersion | None) -> ModelVersion:
        mv = self.lifecycle.new_version(rec.name, version, rec.spec.path, rec.config)
        if old is not None:
            mv.stats = old.stats
            if old.config is not None:      # what the backend completed at its first load
                mv.set_config(old.config)
        for inst in mv.instances:
            inst.move_to(InstanceState.RESTARTING)
            inst.restart_at = math.inf       # started by a page-in only
        mv.unloaded = True      # not a failure: the server is ready without it, its series are off
        self.registry.set_state(mv, UNAVAILABLE,
                                rec.failure and f"paged out: its last load failed: {rec.failure}" or PAGED_OUT)
        mv.restarting = True
        mv.scheduler = new_scheduling(mv, self.requests)
        return mv

    def warm_templates(self, timeout: float) -> None:
        """Start the templates the pageable models' workers fork from, once per kind of worker."""
        specs = {}
        for rec in self.models.values():
            for mv in self.registry.get(rec.name).values():
                config = mv.config or {}
                key = (str(config.get("backend") or ""), str(config.get("platform") or ""))
                if mv.instances and key not in specs:
                    specs[key] = self.lifecycle.worker_spec(mv, mv.instances[0])
        templates = self.lifecycle.pool.templates
        for wait in (0.0, timeout):         # every import starts before any is waited for
            for spec in specs.values():
                templates.warm(spec, wait)

    # ---------------------------------------------------------------- requests

    def resolve(self, name: str, version: int, restarting_ok: bool = False) -> ModelVersion:
        """The registry's lookup; an inference (`restarting_ok`) for a paged-out model asks for
        it to be paged in, or is refused with the reason it cannot be."""
        mv = self._lookup(name, version, restarting_ok)
        if restarting_ok and mv.state is not READY:
            rec = self.models.get(name)
            if rec is not None and rec.phase == OUT:
                self._ask(rec)
        return mv

    def _ask(self, rec: Paged) -> None:
        if self._too_big(rec.name):
            raise self._too_big_error(rec.name)
        now = self.clock.now()
        if now < rec.retry_at:
            raise unavailable(f"model '{rec.name}' failed to load: {rec.failure}; it is tried again in "
                              f"{rec.retry_at - now:.1f} s")
        if rec.name in self.wanted:
            return
        self.wanted.append(rec.name)
        rec.asked_ns = self.clock.now_ns()
        for mv in self.registry.get(rec.name).values():
            mv.restarting_since = now       # the wait for a page-in is bounded like a restart's

    # ---------------------------------------------------------------- the loop's turn

    def tick(self, now: float) -> None:
        """Each loop turn: what page-ins settled, first answers after a page-in, what waits to be
        paged in; every MEASURE_S the resident models' memory and health."""
        if self.exiting:
            self.exiting = [(mv, held) for mv, held in self.exiting if mv in self.registry.retiring]
        for rec in list(self.loading.values()):
            self._settle(rec, now)
        for rec in list(self.first.values()):
            self._first_response(rec)
        if self.wanted:
            self._admit()
        if self.measuring:
            return
        if now >= self.next_measure:
            self._sweep(now)
            self._measure()
        elif self.fresh:
            self._measure(self.fresh)

    def _sweep(self, now: float) -> None:
        """Resident models measured bigger than the budget leave; one whose workers all failed
        (a crash loop) is paged out with the reason, freeing its share of the budget."""
        for rec in list(self.active.values()):
            if rec.phase != IN:
                continue
            versions = list(self.registry.get(rec.name).values())
            if self._too_big(rec.name):
                self._evict_oversize(rec)
            elif versions and all(mv.state is UNAVAILABLE and not mv.restarting for mv in versions):
                self._failed(rec, versions, now)

    def used(self) -> int:
        """Bytes the server takes: its own processes, the pinned models, and the resident, loading
        and exiting pageable models (measured, else expected)."""
        est = self.sizes.estimate
        return self.base + sum(est(name) for name in self.active) + sum(held[HOST] for _, held in self.exiting)

    def used_on(self, gpu: int) -> int:
        """Bytes held on `gpu` by the rest of the server and the resident, loading and exiting models."""
        resident = {name: rec.gpus for name, rec in self.active.items()}
        return self.devices.used(gpu, resident) + sum(held.get(gpu, 0) for _, held in self.exiting)

    def _exiting(self, resource: object) -> int:
        return sum(held.get(resource, 0) for _, held in self.exiting)

    def _admit(self) -> None:
        """Page in what was asked for, in order of asking. Each model that must wait keeps its
        expected size reserved, so those behind it cannot take its room; the workers paged out
        for it are stopped at once, so exits run side by side."""
        reserved: dict[object, int] = {}
        for name in list(self.wanted):
            need = self._page_in(self.models[name], reserved)
            if need is None:
                self.wanted.remove(name)
            else:
                for resource, size in need.items():
                    reserved[resource] = reserved.get(resource, 0) + size

    def _page_in(self, rec: Paged, reserved: dict[object, int]) -> dict[object, int] | None:
        """Start paging `rec` in when it fits beside `reserved` (paging others out first, and
        waiting for their workers to exit): None once started (or refused), else the bytes it
        waits for (host memory, and on each GPU it runs on)."""
        if rec.phase != OUT:
            return None
        need = {HOST: self.sizes.estimate(rec.name), **self.devices.need(rec.name, rec.gpus)}
        if not self.sizes.known and self.active:
            return need             # nothing measured yet: one model at a time until one is
        # room once the workers on their way out have exited: who else must leave for it to fit
        devices = {gpu: (self.devices.budgets[gpu], self.used_on(gpu) - self._exiting(gpu) + reserved.get(gpu, 0),
                         need[gpu]) for gpu in rec.gpus}
        out = victims(self.budget, self.used() - self._exiting(HOST) + reserved.get(HOST, 0), need[HOST],
                      self._candidates(), devices)
        if out is None:
            if self._too_big(rec.name):
                self._refuse(rec)
                return None
            if self.active or self.exiting or reserved:
                return need         # it waits for resident models to become idle
            out = []                # alone it is expected not to fit: it is let in and measured
        for name in out:
            self.page_out(self.models[name])
        if self.exiting and self._short(rec, need, reserved):
            return need             # it starts once they have exited: their memory is still in use
        rec.phase = LOADING_IN
        self.active[rec.name] = rec
        self.loading[rec.name] = rec
        rec.page_ins += 1
        rec.last_used = time.time()
        started = self.clock.now()
        log.info("paging in model '%s' (%d of %d bytes in use)", rec.name, self.used(), self.budget)
        versions = self.registry.get(rec.name).values()
        rec.executions = sum(mv.stats.execution_count for mv in versions)
        for mv in versions:
            mv.load_started = started
            mv.unloaded = False
            self.registry.set_state(mv, LOADING, "paging in")
            for inst in mv.instances:
                self.lifecycle.start_instance(mv, inst)
        return None

    def _short(self, rec: Paged, need: dict[object, int], reserved: dict[object, int]) -> bool:
        """Room is short for `rec` now, counting what is still on its way out."""
        if self.used() + reserved.get(HOST, 0) + need[HOST] > self.budget:
            return True
        return any(self.used_on(gpu) + reserved.get(gpu, 0) + need[gpu] > self.devices.budgets[gpu]
                   for gpu in rec.gpus)

    def _too_big(self, name: str) -> bool:
        """Measured bigger than the budget leaves beside the rest of the server (host or a GPU)."""
        return (self.sizes.known.get(name, 0) > self.budget - self.base
                or self.devices.too_big(name, self.models[name].gpus) is not None)

    def _too_big_error(self, name: str) -> TritonError:
        gpu = self.devices.too_big(name, self.models[name].gpus)
        if gpu is not None:
            return unavailable(f"model '{name}' holds {self.devices.sizes[gpu].known[name]} bytes on GPU {gpu}, more "
                               f"than its --model-gpu-memory-budget of {self.devices.budgets[gpu]} bytes holds beside "
                               f"the rest of the server ({self.devices.base[gpu]} bytes); it is not loaded")
        size = self.sizes.known.get(name)
        if size is None:
            return unavailable(f"the server's own processes and pinned models take {self.base} bytes, more than "
                               f"the --model-memory-budget of {self.budget} bytes; model '{name}' is not loaded")
        return unavailable(f"model '{name}' needs {size} bytes, more than the --model-memory-budget of "
                           f"{self.budget} bytes holds beside the server's own processes and pinned models "
                           f"({self.base} bytes); it is not loaded")

    def _refuse(self, rec: Paged) -> None:
        err = self._too_big_error(rec.name)
        log.error("%s", err.message)
        for mv in self.registry.get(rec.name).values():
            self.requests.fail_queued(mv, err)

    def _evict_oversize(self, rec: Paged) -> None:
        """A resident model measured bigger than the budget: what waits for it fails, and it
        leaves as soon as it is idle; its next request is refused (_ask)."""
        err = self._too_big_error(rec.name)
        versions = self.registry.get(rec.name).values()
        for mv in versions:
            self.requests.fail_queued(mv, err)
        if all(_idle(mv) for mv in versions):
            self.page_out(rec)

    def _candidates(self) -> list[Candidate]:
        out = []
        for rec in self.active.values():
            if rec.phase != IN or rec.name in self.first:
                continue
            versions = self.registry.get(rec.name).values()
            if all(_idle(mv) for mv in versions):
                last = max([rec.last_used, *(mv.stats.last_inference_ms / 1000 for mv in versions)])
                out.append(Candidate(rec.name, self.sizes.estimate(rec.name), last,
                                     self.devices.need(rec.name, rec.gpus)))
        return out

    def page_out(self, rec: Paged) -> None:
        old = self.registry.get(rec.name)
        size = self.sizes.estimate(rec.name)
        held = {HOST: size, **self.devices.need(rec.name, rec.gpus)}
        self.registry.replace(rec.name, {v: self._paged_out(rec, v, mv) for v, mv in old.items()})
        for mv in old.values():
            self._retire(mv)
            if mv in self.registry.retiring:
                self.exiting.append((mv, {r: b // max(1, len(old)) for r, b in held.items()}))
        rec.phase = OUT
        del self.active[rec.name]
        self.first.pop(rec.name, None)
        rec.page_outs += 1
        log.info("paged out model '%s' (least recently used, %d bytes)", rec.name, size)

    def _settle(self, rec: Paged, now: float) -> None:
        """A page-in whose versions all left LOADING: serving, or failed."""
        versions = list(self.registry.get(rec.name).values())
        if any(mv.state is LOADING for mv in versions):
            return
        del self.loading[rec.name]
        if all(mv.state is READY for mv in versions):
            rec.phase = IN
            rec.failures = 0
            rec.failure = ""
            self.first[rec.name] = rec
            self.fresh.add(rec.name)     # measure it at once
            return
        self._failed(rec, versions, now)

    def _failed(self, rec: Paged, versions: list[ModelVersion], now: float) -> None:
        """Its load (or every worker) failed: what waits fails with the reason, and it is paged
        out and not loaded again before its backoff ends."""
        rec.failures += 1
        rec.failure = next((mv.reason for mv in versions if mv.state is not READY and mv.reason), "unknown")
        wait = backoff_s(rec.failures)
        rec.retry_at = now + wait
        log.error("model '%s' failed to page in (%s); not tried again for %g s", rec.name, rec.failure, wait)
        err = unavailable(f"model '{rec.name}' failed to load: {rec.failure}")
        for mv in versions:
            self.requests.fail_queued(mv, err)
        self.registry.replace(rec.name, {mv.version: self._paged_out(rec, mv.version, mv) for mv in versions})
        for mv in versions:
            self._retire(mv)
        rec.phase = OUT
        del self.active[rec.name]
        self.first.pop(rec.name, None)

    def _first_response(self, rec: Paged) -> None:
        versions = self.registry.get(rec.name).values()
        if sum(mv.stats.execution_count for mv in versions) > rec.executions:
            del self.first[rec.name]
            us = (self.clock.now_ns() - rec.asked_ns) / 1000
            rec.first_response.observe(us)
            self.first_response.observe(us)
            self.fresh.add(rec.name)     # what its first execution allocated counts now
        elif all(_idle(mv) for mv in versions):
            del self.first[rec.name]        # what paged it in left unanswered by it (expired, cancelled)

    # ---------------------------------------------------------------- memory

    def _measure(self, only: set[str] | None = None) -> None:
        """Read the PSS of the resident models' workers on the job pool, and of the rest of the
        server (its own processes, the pinned models' workers: they count against the budget
        too). With `only`, just those models': a page-in is measured at once without reading
        every process of the server (each read walks the process's page tables)."""
        names = only if only is not None else [rec.name for rec in self.active.values()]
        pids = {name: [i.pid for mv in self.registry.get(name).values() for i in mv.instances if i.pid]
                for name in names if self.models[name].phase == IN}
        rest = set() if only is not None else self.server_pids() | {
            i.pid for mv in self.registry.versions() if mv.name not in self.models for i in mv.instances if i.pid}
        if only is None:
            self.next_measure = self.clock.now() + MEASURE_S
        self.fresh = set()
        self.measuring = True
        device = self.device_memory

        def read() -> tuple[dict[str, int], int | None, dict[int, dict[int, int]]]:
            return (models_pss(pids), sum(pss_bytes(p) or 0 for p in rest) if rest else None,
                    device.read() if device is not None else {})
        self.jobs.submit(read, lambda fut: self._measured(fut, pids, rest))

    def _measured(self, fut: Any, pids: dict[str, list[int]], rest: set[int]) -> None:
        self.measuring = False
        try:
            sizes, base, device = fut.result()
        except Exception:       # noqa: BLE001 -- a failed read leaves the last measurement standing
            log.exception("measuring the models' memory failed")
            return
        if base is not None:
            if base > self.budget >= self.base:
                log.error("the server's own processes and pinned models take %d bytes, more than the "
                          "--model-memory-budget of %d bytes: no model can be paged in", base, self.budget)
            self.base = base
            held = processes_on(device, rest)
            self.devices.base = {gpu: held.get(gpu, 0) for gpu in self.devices.budgets}
        for name, size in sizes.items():
            now = [i.pid for mv in self.registry.get(name).values() for i in mv.instances if i.pid]
            if self.models[name].phase == IN and now == pids[name]:     # still the workers measured
                self.sizes.record(name, size)
                self.devices.record(name, self.models[name].gpus, processes_on(device, now))
                if self._too_big(name):
                    log.error("%s", self._too_big_error(name).message)

    # ---------------------------------------------------------------- what it reports

    def snapshot(self, quantiles: list[float]) -> R.PagingSnapshot:
        return R.PagingSnapshot(
            budget=self.budget, used=self.used(), server=self.base,
            resident=sum(r.phase == IN for r in self.active.values()),
            first_response=self.first_response.snapshot(quantiles),
            models=[R.ModelPaging(r.name, r.phase == IN, r.page_ins, r.page_outs, r.first_response.count,
                                  int(r.first_response.sum * 1000), self.sizes.known.get(r.name, 0),
                                  {g: self.devices.sizes[g].known.get(r.name, 0) for g in r.gpus})
                    for r in self.models.values()],
            gpus={g: (budget, self.used_on(g)) for g, budget in self.devices.budgets.items()})

    def statistics(self, name: str) -> R.PagingStatistics | None:
        rec = self.models.get(name)
        if rec is None:
            return None
        return R.PagingStatistics(rec.phase == IN, rec.page_ins, rec.page_outs, rec.first_response.count,
                                  int(rec.first_response.sum * 1000), self.sizes.known.get(name, 0), rec.failure)


def _idle(mv: ModelVersion) -> bool:
    """Nothing queued, executing or bound to it (a sequence): it may be paged out."""
    sched = mv.scheduler
    if mv.state is not READY or sched is None or len(sched):
        return False
    return all(i.state in _IDLE and not sched.holds(i) for i in mv.instances)
