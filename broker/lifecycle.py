"""Loading and unloading models: read a model's spec from the repository, create its versions
and instances, start their workers, and derive each version's state from its instances
(LOADING until every instance is up, READY while one serves, UNAVAILABLE with the reason)."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec

from tritond.repository.catalog import load_spec
from tritond.repository.errors import ConfigError
from tritond.repository.layout import ModelSource, scan
from tritond.repository.normalize import normalize_config
from tritond.repository.parameters import config_parameter
from tritond.repository.render import config_from_json, config_to_json
from tritond.repository.validation import validate_config
from tritond.wire.addresses import Addresses
from tritond.wire.errors import unavailable
from tritond.wire.schema import PROTOCOL_VERSION, LogConfig, WorkerSpec, WorkerUp

from .clock import Clock
from .ensembles import Ensembles
from .instances import InstanceTable
from .models import LOADING, READY, UNAVAILABLE, ModelVersion
from .pool import Instance, InstanceState, WorkerProcesses
from .registry import ModelRegistry
from .requests import RequestPath
from .scheduler import BatchPolicy, Scheduler
from .test_hooks import delay_scheduler

log = logging.getLogger("tritond.broker")


class Lifecycle:
    def __init__(self, opts: dict[str, Any], registry: ModelRegistry, instances: InstanceTable,
                 pool: WorkerProcesses, requests: RequestPath, ensembles: Ensembles,
                 send_stop: Callable[[Instance], None], clock: Clock) -> None:
        self.opts = opts
        self.registry = registry
        self.instances = instances
        self.pool = pool
        self.requests = requests
        self.ensembles = ensembles
        self._send_stop = send_stop
        self.clock = clock
        self.workers_endpoint = Addresses(opts["run_dir"]).workers

    # ---------------------------------------------------------------- loading

    def scan(self) -> dict[str, ModelSource]:
        sources = scan(self.opts["model_repositories"])
        self.registry.set_names(sorted(sources))
        return sources

    def startup_models(self, names: list[str]) -> set[str]:
        if self.opts.get("model_control_mode", "none") != "explicit":
            return set(names)
        wanted = list(self.opts.get("load_models") or [])
        return set(names) if "*" in wanted else set(wanted)

    def load_all(self) -> None:
        sources = self.scan()
        wanted = self.startup_models(self.registry.names)
        for name in self.ensembles.load_order(sources, wanted):
            self.load_model(sources[name])
        self.registry.check_startup()

    def load_with_dependencies(self, sources: dict[str, ModelSource], name: str, override: Any = None) -> None:
        """Explicit mode: loading an ensemble first loads what it composes that is not loaded."""
        for dep in self.ensembles.load_order(sources, [name]):
            versions = self.registry.get(dep)
            if dep == name or any(mv.state in (READY, LOADING) for mv in versions.values()):
                continue
            if versions:
                self.unload(dep)
            self.load_model(sources[dep])
        if self.registry.get(name):
            self.unload(name)
        self.load_model(sources[name], override)

    def load_model(self, source: ModelSource, override: Any = None) -> None:
        """Load every selected version of a model; `override` (a ModelConfig) replaces its
        config.pbtxt for this load, as a repository load request's `config` parameter does."""
        spec = load_spec(
            source,
            autocomplete=not self.opts.get("disable_auto_complete", False),
            default_max_batch_size=self.opts.get("default_max_batch_size", 4),
            config_name=self.opts.get("model_config_name", ""),
            override=override,
        )
        self.registry.specs[spec.name] = spec
        for line in spec.advice:
            log.warning(line)
        if spec.error:
            log.error("failed to load '%s': %s", spec.name, spec.error)
            self.registry.replace(spec.name, {
                v: ModelVersion(spec.name, v, spec.path, "", None, UNAVAILABLE, spec.error)
                for v in spec.versions or [0]})
            return
        config = config_to_json(spec.config)
        versions: dict[int, ModelVersion] = {}
        for v in spec.versions:
            if config.get("platform") == "ensemble":
                versions[v] = self.ensembles.setup(spec, v, config)
            else:
                versions[v] = self._version(spec.name, v, spec.path, config)
        self.registry.replace(spec.name, versions)
        for mv in versions.values():
            for inst in mv.instances:
                self.start_instance(mv, inst)

    @staticmethod
    def _version(name: str, version: int, path: str, config: dict[str, Any]) -> ModelVersion:
        mv = ModelVersion(name, version, path, os.path.dirname(path), config)
        index = 0
        for g, group in enumerate(config.get("instance_group") or []):
            kind = str(group.get("kind", "KIND_CPU")).replace("KIND_", "")
            # As Triton: a GPU group has `count` instances on each of its GPUs.
            devices = [int(d) for d in group.get("gpus") or [0]] if kind == "GPU" else [0]
            label = group.get("name") or f"{name}_{g}"
            for i, device in enumerate(d for d in devices for _ in range(int(group.get("count", 1)))):
                mv.instances.append(Instance(name, version, index, f"{label}_{i}", kind=kind, device_id=device))
                index += 1
        return mv

    def worker_spec(self, mv: ModelVersion, inst: Instance) -> WorkerSpec:
        return WorkerSpec(
            server_id=self.opts["server_id"], workers=self.workers_endpoint,
            identity=inst.identity.decode(), broker_pid=os.getpid(),
            model=mv.name, version=mv.version, model_dir=mv.model_dir,
            version_dir=os.path.join(mv.model_dir, str(mv.version)), repository=mv.repo,
            config=mv.config, instance_name=inst.name, kind=inst.kind, device_id=inst.device_id,
            log_verbose=int(self.opts.get("log_verbose", 0)),
            log=msgspec.convert(self.opts["log"], LogConfig) if self.opts.get("log") else None,
            index=inst.index,
        )

    def _env(self, mv: ModelVersion, inst: Instance) -> dict[str, str] | None:
        """A GPU worker's environment, set before any CUDA import: its GPU, and under --mps the
        server's daemon with the model's SM share (parameter mps_active_thread_percentage)."""
        if inst.kind != "GPU":
            return None
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        device = visible[inst.device_id] if inst.device_id < len(visible) else str(inst.device_id)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=device, **self.opts.get("mps_env", {}))
        share = config_parameter(mv.config, "mps_active_thread_percentage")
        if share and "mps_env" in self.opts:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = share
        return env

    def start_instance(self, mv: ModelVersion, inst: Instance) -> None:
        """Spawn a (new generation of a) worker; it gets work only once it says WorkerUp."""
        self.instances.forget(inst)
        inst.generation = self.pool.next_generation()
        inst.state = InstanceState.STARTING
        inst.batch = None
        inst.served = False
        inst.exit_reason = ""
        self.pool.spawn(inst, self.worker_spec(mv, inst), self._env(mv, inst))
        inst.batch_started = inst.last_heartbeat = self.clock.now()
        self.instances.add(inst, mv)

    # ---------------------------------------------------------------- states

    def on_worker_up(self, mv: ModelVersion, inst: Instance, msg: WorkerUp) -> None:
        if msg.proto != PROTOCOL_VERSION:
            inst.exit_reason = (f"speaks protocol version {msg.proto}, the broker {PROTOCOL_VERSION} "
                                f"(a worker from other code)")
            self.pool.kill(inst)
            return
        if msg.config is not None and mv.state == LOADING and msg.config != mv.config:
            err = self.accept_completed_config(mv, msg.config)
            if err:
                self.fail_load(mv, err)
                return
        inst.state = InstanceState.READY
        inst.idle_since = self.clock.now()
        if inst.restarts:
            log.info("instance '%s' of model '%s' is serving again (restart %d, pid %d)",
                     inst.name, mv.name, inst.restarts, msg.pid)
        self.update_state(mv)
        self.requests.dispatch(mv)

    def accept_completed_config(self, mv: ModelVersion, config: dict) -> str:
        """Adopt a config completed by the backend (python auto_complete_config); '' when valid."""
        try:
            cfg = config_from_json(config)
            normalize_config(cfg)
            validate_config(cfg, model_path=mv.model_dir, versions=[mv.version])
        except ConfigError as e:
            return str(e)
        except Exception as e:  # a config dict protobuf cannot parse
            return f"model '{mv.name}': invalid auto-completed config: {e}"
        mv.set_config(config_to_json(cfg))
        self.registry.dirty = True
        return ""

    def update_state(self, mv: ModelVersion) -> None:
        """Derive the model state from its instances (load finished, crashed, restarted):
        READY while any instance can serve, else UNAVAILABLE with the reason."""
        if mv.unloaded or mv.view.ensemble:
            return
        serving = mv.serving()
        if mv.state == LOADING:
            if any(i.state is InstanceState.FAILED for i in mv.instances):
                return
            if len(serving) == len(mv.instances):
                mv.scheduler = Scheduler(BatchPolicy.from_view(mv.view), delay_scheduler(mv.name))
                self.registry.set_state(mv, READY)
                self.registry.check_startup()
            return
        reasons = "; ".join(sorted({i.last_error for i in mv.instances if i.last_error}))
        restarting = not serving and not all(i.state is InstanceState.FAILED for i in mv.instances)
        if restarting and not mv.restarting:
            mv.restarting_since = self.clock.now()
        mv.restarting = restarting       # requests queue for the restarted instance meanwhile
        if serving:
            self.registry.set_state(mv, READY)
        elif not restarting:
            self.registry.set_state(mv, UNAVAILABLE, f"every instance of model '{mv.name}' failed: {reasons}")
            self.requests.fail_queued(mv, unavailable(f"model '{mv.name}' is unavailable: {reasons}"))
        else:
            self.registry.set_state(mv, UNAVAILABLE, f"model '{mv.name}' has no live instance (restarting): {reasons}")

    def fail_load(self, mv: ModelVersion, reason: str) -> None:
        """A first load failed: the model is UNAVAILABLE with the reason; nothing restarts."""
        for inst in mv.instances:
            inst.state = InstanceState.FAILED
            self.pool.kill(inst)
        self.registry.set_state(mv, UNAVAILABLE, reason)
        self.registry.check_startup()

    def unload(self, name: str) -> None:
        for mv in self.registry.get(name).values():
            self.requests.fail_queued(mv, unavailable(f"model '{name}' is being unloaded"))
            for inst in mv.instances:
                if self.pool.alive(inst):
                    inst.state = InstanceState.STOPPING
                    self._send_stop(inst)
            self.registry.mark_unloaded(mv)
