"""Model control: the startup load, explicit load and unload, and poll mode, as operations the
broker's loop drives (oprunner.py) without waiting on any of them.

Every load reads the model's files on the job pool, decides which versions change (reload.py),
starts their workers (which warm up before they say they are up), and switches the table
when they settled. Operations on the same or related models (an ensemble and the models it
composes) run one at a time in arrival order; at most --model-load-thread-count models load
at once. Poll mode rescans every --repository-poll-secs seconds (and on SIGHUP) and acts on
what stayed the same for one interval (repository/poll.py).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Generator
from typing import Any

from tritond.repository.catalog import NO_VERSION, load_spec
from tritond.repository.ensemble import ensemble_dependencies
from tritond.repository.fingerprint import Fingerprint, source_fingerprint
from tritond.repository.layout import ModelSource, scan, validate_model_name
from tritond.repository.overrides import is_override_dir, remove_override_dir
from tritond.repository.parameters import parameter_text
from tritond.repository.partition import partition
from tritond.repository.poll import REMOVE, Change, PollState
from tritond.repository.remote import RemoteError, is_remote, mirror_model
from tritond.repository.render import config_from_json, config_to_json, load_config_json
from tritond.repository.spec import ModelSpec
from tritond.wire.errors import Code, TritonError, invalid
from tritond.wire.options import ServerOptions
from tritond.wire.schema import LoadModel, UnloadModel

from tritond.broker.clock import Clock
from tritond.broker.ensembles.submission import Ensembles
from tritond.broker.lifecycle.version_state import Lifecycle, instances_of
from tritond.broker.tables.model_version import READY, UNAVAILABLE, ModelVersion
from tritond.broker.lifecycle.runner import All, Answer, FreeSlot, Job, Lock, OpRunner, Slot, Until
from tritond.broker.scheduling.rate_limiter import RateLimiter
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.lifecycle.reload import LoadedFrom, failed_entry, plan, serving, settled, switch
from tritond.broker.paging.pager import Pager
from tritond.broker.lifecycle.resize import match, only_instances_changed
from tritond.broker.lifecycle.retire import Retirement
from tritond.broker.lifecycle.threads import ThreadBudget, usable_cores
from tritond.broker.supervision.pool import Instance, InstanceState

log = logging.getLogger("tritond.broker")

NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
NOT_PAGED = ("explicit model load / unload is not allowed with --model-control-mode=paged: models load on their "
             "first request")
SIGHUP_CONFIRM_S = 1.0      # a SIGHUP rescan looks again this soon to confirm what it saw


STARTUP_TEMPLATE_WAIT_S = 60.0
PINNED = "paging_pinned"         # config parameter: paged mode never pages the model out


def _unpolled(name: str) -> TritonError:
    return TritonError(Code.INTERNAL, f"failed to load '{name}', failed to poll from model repository")


class PollFailed(TritonError):
    """A model Triton's repository manager refuses while it polls (ModelSpec.unpolled): its
    error lines go where a load failure's go, and an explicit load of it is answered
    'failed to poll from model repository'."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(Code.INTERNAL, "".join(lines))
        self.lines = lines


def _no_version(name: str) -> str:
    return f"at least one version must be available under the version policy of model '{name}'"


class ModelControl:
    def __init__(self, opts: ServerOptions, registry: ModelRegistry, lifecycle: Lifecycle, ensembles: Ensembles,
                 runner: OpRunner, clock: Clock, limiter: RateLimiter | None, unload_timeout_s: float,
                 send_stop: Callable[[Instance], None], publish: Callable[[], None],
                 fatal: Callable[[], None], server_pids: Callable[[], set[int]]) -> None:
        self.opts = opts
        self.registry = registry
        self.lifecycle = lifecycle
        self.ensembles = ensembles
        self.retirement = Retirement(registry, lifecycle.requests, lifecycle.pool, send_stop, clock,
                                     unload_timeout_s, on_retired=self._retired)
        self.clock = clock
        self.limiter = limiter
        self.mode = opts.model_control_mode
        self.runner = runner
        self.loaded_from: dict[str, LoadedFrom] = {}
        self.poll_state = PollState()
        self.poll_secs = float(opts.repository_poll_secs)
        self.next_poll = float("inf")
        self.polling = False
        self.hangup_pending = False
        self.fingerprints: dict[str, Fingerprint] = {}   # as the last load of each model saw it
        self.elsewhere: dict[str, int] = {}     # models another broker schedules (--broker-shards)
        self.send_stop = send_stop
        self.leaving: list[tuple[ModelVersion, Instance]] = []     # instances a resize removed, until stopped
        self.publish = publish          # sends the table when it changed
        self.fatal = fatal              # the broker cannot go on
        # each CPU instance's share of the host's cores, after one for the broker and one for
        # each frontend process
        frontends = (opts.http_workers if opts.allow_http else 0) + (opts.grpc_workers if opts.allow_grpc else 0)
        shards = opts.broker_shards
        self.threads = ThreadBudget(cores=max(1, usable_cores() // shards) if shards > 1 else None,
                                    reserved=1 + frontends // shards)
        self.pager = (Pager(opts.model_memory_budget, registry, lifecycle, runner.jobs, clock, self.retirement.retire,
                            server_pids, opts.model_gpu_memory_budget) if self.mode == "paged" else None)

    # ---------------------------------------------------------------- entry points

    def startup(self) -> None:
        self.runner.start(self._startup(), self._started)

    def _started(self, result: Any = None, error: TritonError | None = None) -> None:
        if error is not None:       # the repository itself could not be read
            log.error("cannot load the model repository: %s", error.message)
            self.fatal()

    def load(self, op: LoadModel, answer: Answer) -> None:
        """An explicit load; answered once the load settles."""
        try:
            if self.mode != "explicit":
                raise TritonError(Code.UNAVAILABLE, NOT_PAGED if self.mode == "paged" else NOT_EXPLICIT)
            bad = validate_model_name(op.name)
            if bad:
                raise invalid(bad)
            if op.override_dir and not is_override_dir(self.opts.run_dir, op.override_dir, op.name):
                raise invalid("Load parameter 'file:' overrides were not written by this server")
            if op.override_dir and op.config is None:
                raise invalid("Load parameter 'config' must be specified for model file override")
            override = None
            if op.config is not None:
                try:
                    override = config_from_json(load_config_json(op.config))
                except (ValueError, TypeError) as e:
                    # Triton's words (tests and clients match "failed to load" / "Invalid config override")
                    message = f"failed to load '{op.name}', Invalid config override: {e}"
                    log.error("%s", message)
                    raise invalid(message) from None
        except TritonError as e:
            self._drop_override(op.override_dir)
            answer(error=e)
            return
        self.runner.start(self._explicit_load(op.name, override, op.override_dir), self._after_table(answer))

    def unload(self, op: UnloadModel, answer: Answer) -> None:
        if self.mode != "explicit":
            answer(error=TritonError(Code.UNAVAILABLE, NOT_PAGED if self.mode == "paged" else NOT_EXPLICIT))
            return
        self.runner.start(self._unload(op.name, op.unload_dependents), self._after_table(answer))

    def _after_table(self, answer: Answer) -> Answer:
        """Answer once the frontends have the table the operation produced, so a client's next
        request after a load sees the model."""
        def then(*args: Any, **kwargs: Any) -> None:
            self.publish()
            answer(*args, **kwargs)
        return then

    def hangup(self) -> None:
        """SIGHUP: rescan now (poll mode), and confirm what the rescan saw a second later."""
        if self.mode != "poll":
            log.info("SIGHUP: the repository is rescanned on SIGHUP in poll mode only")
            return
        log.info("SIGHUP: rescanning the model repository")
        self.hangup_pending = True
        self.next_poll = self.clock.now()

    def tick(self, now: float) -> None:
        self.runner.tick()
        self.retirement.tick(now)
        if self.leaving:
            self._stop_leaving()
        if self.pager is not None and self.registry.startup_done:
            self.pager.tick(now)
        if now >= self.next_poll and not self.polling and self.registry.startup_done:
            self.polling = True
            self.runner.start(self._poll_round())

    # ---------------------------------------------------------------- reading the repository

    def _scan(self) -> dict[str, ModelSource]:
        """Runs on the job pool. With several brokers, the models this one schedules (the
        others' are noted in `elsewhere` to name their broker in errors)."""
        sources = scan(self.opts.model_repositories)
        shards = self.opts.broker_shards
        if shards == 1:
            return sources
        config = self.opts.model_config_name
        owners = partition({n: ensemble_dependencies(s.path, config) or [] for n, s in sources.items()}, shards)
        self.elsewhere = {n: k for n, k in owners.items() if k != self.opts.shard}
        return {n: s for n, s in sources.items() if owners[n] == self.opts.shard}

    def _order(self, sources: dict[str, ModelSource], wanted: list[str]) -> tuple[list[str], dict[str, list[str]]]:
        """Runs on the job pool (it reads ensemble configs): the models to load, each after
        what it composes, and what each composes."""
        order = self.ensembles.load_order(sources, wanted)
        return order, {n: ensemble_dependencies(sources[n].path, self.opts.model_config_name) or [] for n in order}

    def _read(self, source: ModelSource, override: Any) -> ModelSpec:
        """Runs on the job pool: the spec of one model (mirroring a remote one first)."""
        return load_spec(source, autocomplete=not self.opts.disable_auto_complete,
                         default_max_batch_size=self.opts.default_max_batch_size,
                         config_name=self.opts.model_config_name, override=override,
                         backend_directory=self.opts.backend_directory)

    @staticmethod
    def _fingerprint(source: ModelSource) -> Fingerprint | None:
        if is_remote(source.repo):
            try:
                mirror_model(source.repo, source.name)
            except RemoteError:
                return None
        return source_fingerprint(source)

    # ---------------------------------------------------------------- operations

    def _startup(self) -> Generator:
        try:
            sources = yield Job(self._scan)
        except (OSError, RemoteError) as e:
            raise TritonError(Code.INTERNAL, str(e)) from None
        self.registry.set_names(sorted(sources))
        wanted = set(sources)
        if self.mode == "explicit":
            asked = list(self.opts.load_models)
            wanted = set(sources) if "*" in asked else set(asked) - set(self.elsewhere)
            if self.opts.shard:     # the first broker reports the names no repository holds
                wanted &= set(sources)
            for name in sorted(wanted - set(sources)):
                log.error("failed to poll model '%s': model not found in any model repository.", name)
        read_all: dict[str, Any] = {}
        if self.mode == "paged":
            read = yield All([self._prefetch(sources[n]) for n in sorted(sources)])
            read_all = dict(zip(sorted(sources), read))
            wanted = self._pinned(sources, read_all)
        order, deps = yield Job(lambda: self._order(sources, sorted(wanted)))
        yield Lock(frozenset(order))
        if self.mode == "paged":
            self._page_out_the_rest(sources, set(order), read_all)
        # Every startup model is read before any starts a worker: the thread budget divides
        # the cores among all of their CPU instances.
        read = [read_all[n] for n in order] if read_all else (yield All([self._prefetch(sources[n]) for n in order]))
        prefetched = {n: r for n, r in zip(order, read) if isinstance(r, tuple)}
        self.threads.plan(spec for _, spec in prefetched.values())
        self.lifecycle.wait_for_templates(STARTUP_TEMPLATE_WAIT_S)
        try:
            yield from self._load_in_order(sources, order, deps, prefetched=prefetched)
        finally:
            self.lifecycle.wait_for_templates(0.0)
            self.threads.planned.clear()
        self.registry.startup_done = True
        self.registry.dirty = True
        if self.mode == "poll":
            self.poll_state.baseline(dict(self.fingerprints))
            self._schedule_poll(0.0 if self.hangup_pending else None)

    def _pinned(self, sources: dict[str, ModelSource], read: dict[str, Any]) -> set[str]:
        """Paged mode: the models loaded at startup and never paged out: those --load-model
        names, those whose config sets parameter `paging_pinned` to true, and ensembles (with
        what they compose, added by the load order)."""
        for name in self.opts.load_models:
            if name not in sources:
                log.error("failed to poll model '%s': model not found in any model repository.", name)
        pinned = set(self.opts.load_models) & set(sources)
        for name, r in read.items():
            spec = r[1] if isinstance(r, tuple) else None
            if spec is None or spec.config is None:
                continue
            pinned_by_config = parameter_text(spec.config, PINNED).strip().lower() in ("true", "1", "yes")
            if spec.config.platform == "ensemble" or pinned_by_config:
                pinned.add(name)
        return pinned

    def _page_out_the_rest(self, sources: dict[str, ModelSource], pinned: set[str], read: dict[str, Any]) -> None:
        """Paged mode: every model not pinned goes in the table paged out (pager.py); one that
        cannot be read, or that runs on a GPU without a --model-gpu-memory-budget (or on devices
        its backend chooses, KIND_MODEL), is UNAVAILABLE with the reason."""
        assert self.pager is not None
        for name in sorted(set(sources) - pinned):
            r = read[name]
            if not isinstance(r, tuple):
                spec = ModelSpec(name, sources[name].path, None, [], getattr(r, "message", str(r)))
            else:
                fp, spec = r
                if fp is not None:
                    self.fingerprints[name] = fp
            if spec.error:
                self._failed(spec, {})
                continue
            config = config_to_json(spec.config)
            why = self._unpageable(name, instances_of(name, 0, config))
            if why:
                log.error("%s", why)
                self.registry.specs[name] = spec
                self._replace(name, failed_entry(name, spec.path, spec.versions, why), {})
                continue
            self.pager.add(spec, config)
        self.pager.warm_templates(STARTUP_TEMPLATE_WAIT_S)

    def _unpageable(self, name: str, instances: list[Instance]) -> str:
        """Why paged mode cannot page these instances ('' when it can): GPUs without a budget,
        or devices the backend chooses."""
        pin = f"pin it with --load-model={name} or parameter {PINNED}"
        if any(inst.kind == "MODEL" for inst in instances):
            return f"model '{name}' has KIND_MODEL instances, whose devices paging cannot budget; {pin}"
        missing = sorted({inst.device_id for inst in instances if inst.kind == "GPU"}
                         - set(self.opts.model_gpu_memory_budget))
        if missing:
            return (f"model '{name}' has instances on GPU {', '.join(map(str, missing))}, which has no "
                    f"--model-gpu-memory-budget; set one, or {pin}")
        return ""

    def _explicit_load(self, name: str, override: Any, override_dir: str) -> Generator:
        try:
            unpolled = _unpolled(name)
            try:
                sources = yield Job(self._scan)
            except (OSError, RemoteError) as e:
                log.error("load '%s': cannot scan the model repository: %s", name, e)
                raise unpolled from None
            self.registry.set_names(sorted(sources))
            if override_dir:
                # As Triton: a load with file overrides polls no repository for the model; it is
                # made of the overrides alone, whether or not the repositories hold that name.
                sources = dict(sources)
                sources[name] = ModelSource(name, override_dir, os.path.dirname(override_dir))
            elif name in self.elsewhere:
                raise TritonError(Code.INTERNAL, f"failed to load '{name}': broker {self.elsewhere[name]} "
                                                 f"schedules it (--broker-shards), not broker {self.opts.shard}")
            elif name not in sources:
                raise unpolled
            order, deps = yield Job(lambda: self._order(sources, [name]))
            yield Lock(frozenset(order))
            errors = yield from self._load_in_order(sources, order, deps, name, override,
                                                     force=override is not None, explicit=True)
        finally:
            self._drop_override(override_dir)
        if errors:
            raise invalid("".join(errors))

    def _load_in_order(self, sources: dict[str, ModelSource], order: list[str], deps: dict[str, list[str]],
                       requested: str = "", override: Any = None, force: bool = False,
                       prefetched: dict[str, tuple] | None = None, explicit: bool = False) -> Generator:
        """Load `order` in waves: a model once every model it composes (in `order`) settled.
        `explicit` (a load request): a model refused while polling fails the request as Triton's
        'failed to poll', its reason logged."""
        done: set[str] = set()
        errors: list[str] = []
        polled = True
        pending = list(order)
        while pending:
            wave = [n for n in pending if all(d in done or d not in order for d in deps.get(n, []))] or pending
            pending = [n for n in pending if n not in wave]
            results = yield All([self._load_model(sources[n], override if n == requested else None,
                                                  force and n == requested, (prefetched or {}).get(n))
                                 for n in wave])
            done.update(wave)
            for n, r in zip(wave, results):
                if isinstance(r, PollFailed):
                    errors.extend(r.lines)
                    polled = False
                elif isinstance(r, TritonError):
                    errors.append(f"load failed for model '{n}': {r.message}\n")
                else:
                    errors.extend(r or [])
        if explicit and not polled:
            raise _unpolled(requested)
        return errors

    def _prefetch(self, source: ModelSource) -> Generator:
        """Read one model's fingerprint and spec ahead of its load (the startup load)."""
        fp = yield Job(lambda: self._fingerprint(source))
        spec = yield from self._read_spec(source, None)
        return fp, spec

    def _read_spec(self, source: ModelSource, override: Any) -> Generator:
        try:
            spec = yield Job(lambda: self._read(source, override))
        except (OSError, ValueError, RemoteError) as e:     # what load_spec does not turn into an error itself
            log.exception("reading model '%s' failed", source.name)
            spec = ModelSpec(source.name, source.path, None, [], f"cannot read the model: {e}")
        return spec

    def _load_model(self, source: ModelSource, override: Any = None, force: bool = False,
                    prefetched: tuple[Fingerprint | None, ModelSpec] | None = None) -> Generator:
        """Load or reload one model; returns the lines of Triton's load error ([] when fine).
        `prefetched`: its fingerprint and spec, already read."""
        name = source.name
        yield Slot()
        started = self.clock.now()
        fp = prefetched[0] if prefetched is not None else (yield Job(lambda: self._fingerprint(source)))
        if fp is not None:
            self.fingerprints[name] = fp
        old = dict(self.registry.get(name))
        before = self.loaded_from.get(name)
        if (not force and before is not None and not before.overridden and old and fp is not None
                and fp == before.fingerprint and all(mv.state == READY for mv in old.values())):
            return []
        spec = prefetched[1] if prefetched is not None else (yield from self._read_spec(source, override))
        for line in spec.advice:
            log.warning(line)
        if spec.error:
            self.threads.done(name)
            lines = self._failed(spec, old)
            if spec.unpolled:
                raise PollFailed(lines)
            return lines
        config = config_to_json(spec.config)
        now = LoadedFrom(source.path, config, fp, override is not None)
        if only_instances_changed(before, now, old, spec.versions):
            errors = yield from self._resize(spec, config, old, now)
            return errors
        change = plan(old, before, now, spec.versions, force)
        if change.nothing and all(mv.state == READY for mv in old.values()):
            self.loaded_from[name] = now
            self.threads.done(name)
            return []
        log.info("loading model '%s' version(s) %s%s", name, ", ".join(map(str, change.load)) or "-",
                 f", keeping {', '.join(map(str, change.keep))}" if change.keep else "")
        staged = {v: self._new_version(spec, v, config, started) for v in change.load}
        if serving(old):
            self.registry.loading.extend(staged.values())
        else:
            self._replace(name, {**{v: old[v] for v in change.keep}, **staged}, old)
            self.registry.specs[name] = spec
        self.threads.assign(self.registry, [mv for mv in staged.values() if mv.instances],
                            [old[v] for v in change.keep if v in old])
        for mv in staged.values():
            refused = self.limiter.register(mv) if self.limiter is not None and mv.instances else ""
            if refused:
                self.lifecycle.fail_load(mv, refused)
                continue
            for inst in mv.instances:
                self.lifecycle.start_instance(mv, inst)
        yield Until(lambda: settled(staged))
        yield FreeSlot()
        for mv in staged.values():
            if mv in self.registry.loading:
                self.registry.loading.remove(mv)
        outcome = switch(name, old, staged, spec.versions)
        if any(v in staged and outcome.table[v] is staged[v] for v in outcome.table) or not serving(old):
            self.registry.specs[name] = spec
        self._replace(name, outcome.table, old)
        for mv in outcome.discarded:
            self.retirement.retire(mv)
        if not outcome.failures:
            self.loaded_from[name] = now
        return [f"load failed for model '{name}': version {v} is at UNAVAILABLE state: {why};\n"
                for v, why in outcome.failures]

    def _resize(self, spec: ModelSpec, config: dict, old: dict[int, ModelVersion], now: LoadedFrom) -> Generator:
        """Update the instances of a model whose load changed only its instance groups
        (resize.py); answered once the new instances serve and the removed ones stopped."""
        name = spec.name
        if self.limiter is not None:
            refused = self.limiter.refusal(config, instances_of(name, 0, config))
            if refused:
                log.error("failed to load '%s': %s", name, refused)
                return [f"load failed for model '{name}': {refused}\n"]
        added: list[Instance] = []
        removed: list[tuple[ModelVersion, Instance]] = []
        for mv in old.values():
            new, gone = match(mv, config)
            threads = next(iter(mv.threads.values()), None)
            mv.set_config({**(mv.config or {}), "instance_group": config.get("instance_group", [])})
            for inst in new:
                if threads is not None:
                    mv.threads[inst.index] = threads
            if self.limiter is not None:
                self.limiter.register(mv)
            added += new
            removed += [(mv, inst) for inst in gone]
            for inst in new:
                self.lifecycle.start_instance(mv, inst)
        log.info("model '%s': %d instance(s) added, %d removed; the others keep serving", name, len(added),
                 len(removed))
        self.leaving.extend(removed)
        self._stop_leaving()
        self.registry.dirty = True
        yield Until(lambda: all(i.state not in (InstanceState.STARTING, InstanceState.RESTARTING) for i in added)
                    and all(i.state in (InstanceState.STOPPED, InstanceState.FAILED) or mv.scheduler.holds(i)
                            for mv, i in removed))
        yield FreeSlot()
        self.loaded_from[name] = now
        self.registry.specs[name] = spec
        self.threads.done(name)
        return [f"load failed for model '{name}': instance '{i.name}' failed: {i.last_error};\n"
                for i in added if i.state is InstanceState.FAILED]

    def _stop_leaving(self) -> None:
        """Instances a resize removed: each stops once idle; a stopped one leaves its version."""
        for mv, inst in list(self.leaving):
            if inst.state is InstanceState.READY and mv.scheduler is not None and mv.scheduler.holds(inst):
                continue
            if inst.state in (InstanceState.READY, InstanceState.STARTING) and self.lifecycle.pool.alive(inst):
                inst.move_to(InstanceState.STOPPING)
                self.send_stop(inst)
            elif inst.state is InstanceState.RESTARTING:
                inst.move_to(InstanceState.STOPPED)
            if inst.state in (InstanceState.STOPPED, InstanceState.FAILED):
                self.leaving.remove((mv, inst))
                if inst in mv.instances:
                    mv.instances.remove(inst)
                mv.threads.pop(inst.index, None)
                if mv.scheduler is not None:
                    mv.scheduler.forget(inst)
                if self.limiter is not None:
                    self.limiter.forget(inst)

    def _failed(self, spec: ModelSpec, old: dict[int, ModelVersion]) -> list[str]:
        """A model whose spec cannot be loaded: an old version that serves keeps serving."""
        name = spec.name
        error = _no_version(name) if spec.error == NO_VERSION else spec.error
        if spec.unpolled:
            log.error("Poll failed for model directory '%s': %s", name, error)
        else:
            log.error("failed to load '%s': %s", name, error)
        if serving(old):
            for mv in old.values():
                if mv.state == READY:
                    mv.reload_error = f"a reload failed, this version still serves: {error}"
            return [f"load failed for model '{name}': {error}\n"]
        self.registry.specs[name] = spec
        self._replace(name, failed_entry(name, spec.path, spec.versions, error), old)
        self.loaded_from.pop(name, None)
        if spec.error == NO_VERSION:
            return [f"load failed for model '{name}': {error}\n"]
        return [f"load failed for model '{name}': version {v} is at UNAVAILABLE state: {spec.error};\n"
                for v in spec.versions or [0]]

    def _new_version(self, spec: ModelSpec, version: int, config: dict, started: float) -> ModelVersion:
        if config.get("platform") == "ensemble":
            mv = self.ensembles.setup(spec, version, config)
        else:
            mv = self.lifecycle.new_version(spec.name, version, spec.path, config)
        mv.load_started = started
        return mv

    def _replace(self, name: str, table: dict[int, ModelVersion], old: dict[int, ModelVersion]) -> None:
        """Put `table` in for the model; what of `old` it leaves out retires."""
        self.registry.replace(name, table)
        dropped = self.registry.dropped.setdefault(name, set())
        dropped.difference_update(table)
        dropped.update(v for v in old if v not in table)
        kept = {id(mv) for mv in table.values()}
        for mv in old.values():
            if id(mv) not in kept:
                self.retirement.retire(mv)

    def _unload(self, name: str, dependents: bool) -> Generator:
        names = [name, *(self.ensembles.dependencies(name) if dependents else [])]
        yield Lock(frozenset(names))
        for n in names:
            for mv in self.registry.get(n).values():
                if not mv.unloaded:
                    self.retirement.retire(mv, unload=True)

    # ---------------------------------------------------------------- poll mode

    def _schedule_poll(self, delay: float | None = None) -> None:
        if delay is None:
            delay = self.poll_secs if self.poll_secs > 0 else float("inf")
        self.next_poll = self.clock.now() + delay

    def _snapshot(self) -> tuple[dict[str, ModelSource], dict[str, Fingerprint]]:
        """Runs on the job pool."""
        sources = self._scan()
        fps = {}
        for name, source in sources.items():
            fp = self._fingerprint(source)
            if fp is not None:
                fps[name] = fp
        return sources, fps

    def _poll_round(self) -> Generator:
        try:
            sources, fps = yield Job(self._snapshot)
        except (OSError, RemoteError) as e:
            log.error("poll: cannot scan the model repository: %s", e)
            sources, fps = None, {}
        finally:
            self.polling = False
        confirm = self.hangup_pending
        self.hangup_pending = False
        if sources is None:
            self._schedule_poll()
            return None
        self.registry.set_names(sorted(set(sources) | set(self.registry.models)))
        for change in self.poll_state.observe(fps, frozenset(self.runner.locked())):
            log.info("poll: model '%s' %s", change.name, {"add": "was added", "modify": "changed",
                                                          "remove": "was removed"}[change.kind])
            self.runner.start(self._poll_change(change, sources), self._poll_done)
        if confirm and self.poll_state.pending:
            self._schedule_poll(min(SIGHUP_CONFIRM_S, self.poll_secs) if self.poll_secs > 0 else SIGHUP_CONFIRM_S)
        else:
            self._schedule_poll()
        return None

    @staticmethod
    def _poll_done(result: Any = None, error: TritonError | None = None) -> None:
        if error is not None:
            log.error("poll: %s", error.message.strip())
        elif result:
            log.error("poll: %s", "".join(result).strip())

    def _poll_change(self, change: Change, sources: dict[str, ModelSource]) -> Generator:
        name = change.name
        if change.kind == REMOVE:
            yield Lock(frozenset([name]))
            for mv in self.registry.get(name).values():
                self.retirement.retire(mv)
            self.registry.models.pop(name, None)
            self.registry.dropped.pop(name, None)
            self.registry.specs.pop(name, None)
            self.loaded_from.pop(name, None)
            self.fingerprints.pop(name, None)
            self.registry.set_names(sorted(n for n in self.registry.names if n != name))
            self.registry.dirty = True
            return None
        order, deps = yield Job(lambda: self._order(sources, [name]))
        yield Lock(frozenset(order))
        errors = yield from self._load_in_order(sources, order, deps, name)
        return errors

    # ---------------------------------------------------------------- override directories

    def _in_use(self, model_dir: str) -> bool:
        """A version loads or serves from it (or pages in from it), or retires with workers that
        may still read it; a version that stays in the table unloaded, or failed, has no use for it."""
        return any(mv.model_dir == model_dir and (mv.state is not UNAVAILABLE or mv.restarting
                                                  or mv in self.registry.retiring)
                   for mv in self.registry.all_versions())

    def _drop_override(self, override_dir: str) -> None:
        """Remove an override directory no version uses (any more)."""
        if override_dir and is_override_dir(self.opts.run_dir, override_dir, os.path.basename(override_dir)) \
                and not self._in_use(override_dir):
            remove_override_dir(override_dir)

    def _retired(self, mv: ModelVersion) -> None:
        if self.limiter is not None:
            self.limiter.unregister(mv)
        self._drop_override(mv.model_dir)
