"""Everything the broker answers besides inference: repository index and model control,
statistics, client shared-memory regions, log/trace settings, drain and stop.

One method per control operation struct; each returns its typed result (wire/replies.py; None
for an operation that only succeeds) or raises TritonError.
A load, an unload and a drain are answered later (model_ops.py runs loads and unloads; a
drain is answered when it ends)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tritond.repository.devices import gpu_count
from tritond.shm.regions import CUDA, CUDA_HANDLE_BYTES, SYSTEM
from tritond.wire.errors import Code, TritonError, invalid
from tritond.wire import replies as R
from tritond.wire import schema as S
from tritond.wire.options import ServerOptions

from tritond.broker.tables.client_regions import ClientRegions
from tritond.broker.drain import Drain
from tritond.broker.ensembles.submission import Ensembles
from tritond.broker.lifecycle.operations import ModelControl
from tritond.broker.lifecycle.readiness import Readiness
from tritond.broker.tables.model_version import READY, UNAVAILABLE, ModelVersion
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.settings import Settings

log = logging.getLogger("tritond.broker")

Answer = Callable[..., None]    # answer(result) or answer(error=TritonError)


class _Deferred:
    """Returned by an operation that answers later."""


DEFERRED = _Deferred()


class ControlHandler:
    def __init__(self, opts: ServerOptions, registry: ModelRegistry, model_ops: ModelControl,
                 ensembles: Ensembles, regions: ClientRegions, drain: Drain, settings: Settings,
                 begin_drain: Callable[[], None], stop: Callable[[], None],
                 snapshot: Callable[[], R.MetricsReply], readiness: Readiness) -> None:
        self.allow_client_shm = opts.allow_client_shm
        self.registry = registry
        self.model_ops = model_ops
        self.pager = model_ops.pager
        self.ensembles = ensembles
        self.regions = regions
        self.drain = drain
        self.settings = settings
        self._begin_drain = begin_drain
        self._stop = stop
        self._snapshot = snapshot
        self.readiness = readiness
        self._ops: dict[type, Callable[[Any, Answer], R.ControlResult | _Deferred]] = {
            S.RepositoryIndex: self.index, S.LoadModel: self.load, S.UnloadModel: self.unload,
            S.Statistics: self.stats, S.ModelMetrics: self.metrics,
            S.ShmRegister: self.shm_register, S.ShmUnregister: self.shm_unregister, S.ShmStatus: self.shm_status,
            S.CudaRegister: self.cuda_register, S.CudaUnregister: self.cuda_unregister,
            S.CudaStatus: self.cuda_status, S.LogSettings: self.log_settings,
            S.TraceSettings: self.trace_settings, S.ReopenLog: self.reopen_log, S.Drain: self.drain_op,
            S.StopServer: self.stop, S.ModelReady: self.model_ready,
        }

    def handle(self, op: S.ControlOp, answer: Answer) -> None:
        try:
            result = self._ops[type(op)](op, answer)
        except TritonError as e:
            answer(error=e)
            return
        except (KeyError, TypeError, ValueError, AttributeError):
            log.warning("control '%s' with malformed arguments", type(op).__name__, exc_info=True)
            answer(error=invalid(f"malformed arguments for '{type(op).__name__}'"))
            return
        if result is not DEFERRED:
            answer(result)

    # ---------------------------------------------------------------- repository

    def index(self, op: S.RepositoryIndex, answer: Answer) -> R.IndexReply:
        out = []
        for name in self.registry.names:
            versions = self.registry.get(name)
            if not versions:
                if not op.ready:
                    out.append(R.ModelIndex(name))
                continue
            dropped = () if op.ready else self.registry.dropped.get(name, ())
            for v in sorted({*versions, *dropped}):
                mv = versions.get(v)
                if mv is None:
                    out.append(R.ModelIndex(name, str(v), UNAVAILABLE.value, "unloaded"))
                    continue
                if op.ready and mv.state != READY:
                    continue
                reason = mv.reason or (mv.reload_error if mv.state == READY else "")
                out.append(R.ModelIndex(name, str(v), mv.state.value, reason))
        return R.IndexReply(out)

    def load(self, op: S.LoadModel, answer: Answer) -> _Deferred:
        self.model_ops.load(op, answer)
        return DEFERRED

    def unload(self, op: S.UnloadModel, answer: Answer) -> _Deferred:
        self.model_ops.unload(op, answer)
        return DEFERRED

    def model_ready(self, op: S.ModelReady, answer: Answer) -> R.ReadyReply | _Deferred:
        """A ready version whose model defines is_ready() is ready when each serving instance's says so."""
        try:
            mv = self.registry.resolve(op.name, op.version)
        except TritonError:
            return R.ReadyReply(False)
        self.readiness.ask(mv, [i for i in mv.serving() if i.ready_hook], answer)
        return DEFERRED

    # ---------------------------------------------------------------- statistics

    def stats(self, op: S.Statistics, answer: Answer) -> R.StatsReply:
        listed = self._listed
        if not op.name:
            return self._reply([mv for mv in self.registry.versions() if listed(mv)])
        versions = self.registry.get(op.name)
        if not any(listed(mv) for mv in versions.values()):
            self.registry.resolve(op.name, op.version)      # Triton's error for the name
            raise TritonError(Code.NOT_FOUND, f"Request for unknown model: '{op.name}' has no available versions")
        if op.version >= 0:
            mv = versions.get(op.version)
            if mv is None or not listed(mv):
                mv = self.registry.resolve(op.name, op.version)     # Triton's error for the version
            return self._reply([mv])
        return self._reply([mv for _, mv in sorted(versions.items()) if listed(mv)])

    def _listed(self, mv: ModelVersion) -> bool:
        """READY versions have statistics; in paged mode paged-out ones too (`restarting`)."""
        return mv.state == READY or (self.pager is not None and mv.restarting)

    def _reply(self, versions: list[ModelVersion]) -> R.StatsReply:
        """Their statistics; in paged mode with each pageable model's paging, and Triton's
        memory_usage holding the measured size of a resident one."""
        stats = [mv.stats.statistics() for mv in versions]
        if self.pager is None:
            return R.StatsReply(stats)
        paging = {}
        for mv, one in zip(versions, stats):
            p = self.pager.statistics(mv.name)
            if p is not None:
                paging[mv.name] = p
                if p.resident and p.memory_bytes:
                    one.memory_usage = [R.MemoryUsage("CPU", 0, p.memory_bytes)]
        return R.StatsReply(stats, paging)

    def metrics(self, op: S.ModelMetrics, answer: Answer) -> R.MetricsReply:
        """What one /metrics scrape reports (broker/observe/metrics.py)."""
        return self._snapshot()

    # ---------------------------------------------------------------- shared memory

    def _require_shm(self) -> None:
        if not self.allow_client_shm:
            raise TritonError(Code.UNSUPPORTED, "Client shared memory is disabled. Start the server with "
                                                "'--allow-client-shm=true' to enable.")

    def shm_register(self, op: S.ShmRegister, answer: Answer) -> None:
        self._require_shm()
        self.regions.register_system(op.name, op.key, op.offset, op.byte_size)

    def shm_unregister(self, op: S.ShmUnregister, answer: Answer) -> None:
        self._require_shm()
        self.regions.unregister(op.name, SYSTEM)

    def shm_status(self, op: S.ShmStatus, answer: Answer) -> R.ShmStatusReply:
        return self.regions.system_status(op.name)

    def cuda_register(self, op: S.CudaRegister, answer: Answer) -> None:
        """Workers open the IPC handle on first use; the broker never loads CUDA, it only
        checks (cheaply, via nvidia-smi) that the device exists."""
        self._require_shm()
        if len(op.raw_handle) != CUDA_HANDLE_BYTES:
            raise invalid(f"failed to register shared memory region '{op.name}': invalid args "
                          "('raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t)")
        count = gpu_count()
        if count == 0:
            raise invalid(f"failed to register CUDA shared memory region: '{op.name}', GPUs not supported")
        if not 0 <= op.device_id < count:
            raise invalid(f"failed to register shared memory region '{op.name}': invalid args")
        self.regions.register_cuda(op.name, op.raw_handle, op.device_id, op.byte_size)

    def cuda_unregister(self, op: S.CudaUnregister, answer: Answer) -> None:
        self._require_shm()
        self.regions.unregister(op.name, CUDA)

    def cuda_status(self, op: S.CudaStatus, answer: Answer) -> R.CudaStatusReply:
        return self.regions.cuda_status(op.name)

    # ---------------------------------------------------------------- settings

    def log_settings(self, op: S.LogSettings, answer: Answer) -> R.LogSettingsReply:
        return R.LogSettingsReply(self.settings.update_log(op.settings))

    def reopen_log(self, op: S.ReopenLog, answer: Answer) -> None:
        self.settings.reopen_log()

    def trace_settings(self, op: S.TraceSettings, answer: Answer) -> R.TraceSettingsReply:
        if op.model and not any(mv.state is READY for mv in self.registry.get(op.model).values()):
            # tritonserver's words for a model that is not ready (its trace handlers check that)
            raise TritonError(Code.INVALID_ARG, f"Request for unknown model : {op.model}")
        return R.TraceSettingsReply(self.settings.update_trace(op.model, op.settings))

    # ---------------------------------------------------------------- shutdown

    def drain_op(self, op: S.Drain, answer: Answer) -> _Deferred:
        self._begin_drain()
        self.drain.wait(answer)
        return DEFERRED

    def stop(self, op: S.StopServer, answer: Answer) -> None:
        self._stop()
