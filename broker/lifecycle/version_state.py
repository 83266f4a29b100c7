"""A model version's instances and state: create them, start their workers, and derive the
version's state from its instances (LOADING until every instance is up and warm, READY while
one serves, UNAVAILABLE with the reason). Which versions load when is model_ops.py's."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from tritond.repository.backends import PYTHON_RUNTIME
from tritond.repository.errors import ConfigError
from tritond.repository.normalize import normalize_config
from tritond.repository.parameters import config_parameter
from tritond.repository.python_based import runtime_dir
from tritond.repository.render import config_from_json, config_to_json
from tritond.repository.validation import validate_config
from tritond.wire.addresses import Addresses
from tritond.wire.errors import unavailable
from tritond.wire.options import ServerOptions
from tritond.wire.schema import PROTOCOL_VERSION, WorkerSpec, WorkerUp

from tritond.broker.clock import Clock
from tritond.broker.tables.instances import InstanceTable
from tritond.broker.tables.model_version import LOADING, READY, UNAVAILABLE, ModelVersion
from tritond.broker.supervision.pool import Instance, InstanceState, WorkerProcesses
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.scheduling.path import RequestPath
from tritond.broker.scheduling.factory import new_scheduling

log = logging.getLogger("tritond.broker")


class Lifecycle:
    def __init__(self, opts: ServerOptions, registry: ModelRegistry, instances: InstanceTable,
                 pool: WorkerProcesses, requests: RequestPath, clock: Clock, on_settle: Callable[[], None],
                 latency: Callable[[Any], Any] | None = None) -> None:
        self.opts = opts
        self.registry = registry
        self.instances = instances
        self.pool = pool
        self.requests = requests
        self.clock = clock
        self.workers_endpoint = Addresses(opts.run_dir, opts.shard).workers
        self.on_settle = on_settle      # a version left LOADING
        self.latency = latency          # builds a version's latency observer (--metrics-config)

    def wait_for_templates(self, seconds: float) -> None:
        """How long starting a worker may wait for its kind's template to finish importing:
        during startup (nothing is served yet) rather than spawn it with its own import; after
        it, never, so the loop does not stop for an import."""
        self.pool.templates.wait_s = seconds

    # ---------------------------------------------------------------- versions and instances

    def new_version(self, name: str, version: int, path: str, config: dict[str, Any]) -> ModelVersion:
        """A version and its instances (Triton's instance groups), nothing started yet."""
        mv = ModelVersion(name, version, path, os.path.dirname(path), config, latency=self.latency)
        mv.instances = instances_of(name, version, config)
        return mv

    def worker_spec(self, mv: ModelVersion, inst: Instance) -> WorkerSpec:
        threads = mv.threads.get(inst.index)     # decided at load (lifecycle/threads.py); kept on restarts
        return WorkerSpec(
            server_id=self.opts.server_id, workers=self.workers_endpoint,
            identity=inst.identity.decode(), broker_pid=os.getpid(),
            model=mv.name, version=mv.version, model_dir=mv.model_dir,
            version_dir=os.path.join(mv.model_dir, str(mv.version)), repository=mv.repo,
            config=mv.config, instance_name=inst.name, kind=inst.kind, device_id=inst.device_id,
            log_verbose=self.opts.log_verbose,
            log=self.opts.log,
            index=inst.index,
            threads=threads.threads if threads else 0,
            inter_op_threads=threads.inter_op_threads if threads else 0,
            override_run_dir=self.opts.run_dir if self.opts.model_control_mode == "explicit" else "",
            override_max_bytes=self.opts.model_file_override_max_bytes,
            runtime_dir=(runtime_dir(self.opts.backend_directory, mv.config.get("backend", ""))
                         if mv.config.get("runtime") == PYTHON_RUNTIME else ""),
        )

    def _env(self, mv: ModelVersion, inst: Instance) -> dict[str, str] | None:
        """A GPU worker's environment, set before any CUDA import: its GPU, and under --mps the
        server's daemon with the model's SM share (parameter mps_active_thread_percentage)."""
        if inst.kind != "GPU":
            return None
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        device = visible[inst.device_id] if inst.device_id < len(visible) else str(inst.device_id)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=device, **self.opts.mps_env)
        share = config_parameter(mv.config, "mps_active_thread_percentage")
        if share and self.opts.mps_env:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = share
        return env

    def start_instance(self, mv: ModelVersion, inst: Instance) -> None:
        """Spawn a (new generation of a) worker; it gets work only once it says WorkerUp."""
        self.instances.forget(inst)
        inst.generation = self.pool.next_generation()
        inst.move_to(InstanceState.STARTING)
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
        if msg.config is not None and mv.state == LOADING:      # its inputs and outputs are checked here
            err = self.accept_completed_config(mv, msg.config)
            if err:
                self.fail_load(mv, err)
                return
        if inst.state is not InstanceState.STARTING:
            return          # its version retired (or it was killed) while it loaded: it gets no work
        inst.move_to(InstanceState.READY)
        inst.idle_since = self.clock.now()
        if inst.ready_hook != msg.ready_hook:
            inst.ready_hook = msg.ready_hook
            self.registry.dirty = True
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
            validate_config(cfg, model_path=mv.model_dir, versions=[mv.version],
                            backend_directory=self.opts.backend_directory)
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
                if mv.scheduler is None:    # a paged-in version has its own, with what queued for it
                    mv.scheduler = new_scheduling(mv, self.requests)
                mv.restarting = False
                mv.load_duration = self.clock.now() - mv.load_started if mv.load_started else 0.0
                log.info("loaded model '%s' version %d in %.3f s", mv.name, mv.version, mv.load_duration)
                self.registry.set_state(mv, READY)
                self.on_settle()
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
            if inst.state is not InstanceState.STOPPED:
                inst.move_to(InstanceState.FAILED)
                self.pool.kill(inst)
        self.registry.set_state(mv, UNAVAILABLE, reason)
        self.on_settle()


def instances_of(name: str, version: int, config: dict[str, Any], first_index: int = 0) -> list[Instance]:
    """The instances a config's instance groups ask for, numbered from `first_index`."""
    out = []
    index = first_index
    for g, group in enumerate(config.get("instance_group") or []):
        kind = str(group.get("kind", "KIND_CPU")).replace("KIND_", "")
        # As Triton: a GPU group has `count` instances on each of its GPUs.
        devices = [int(d) for d in group.get("gpus") or [0]] if kind == "GPU" else [0]
        label = group.get("name") or f"{name}_{g}"
        for i, device in enumerate(d for d in devices for _ in range(int(group.get("count", 1)))):
            out.append(Instance(name, version, index, f"{label}_{i}", kind=kind, device_id=device, group=g))
            index += 1
    return out
