"""Everything the broker answers besides inference: repository index, statistics,
model control, client shared-memory regions, log/trace settings, drain and stop."""
from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import zmq

from tritond.repository.devices import gpu_count
from tritond.repository.errors import ConfigError
from tritond.repository.layout import scan
from tritond.repository.normalize import normalize_config
from tritond.repository.render import config_from_json, config_to_json
from tritond.repository.validation import validate_config
from tritond.shm.regions import CUDA, CUDA_HANDLE_BYTES, SYSTEM, RegionError, RegionTable

from . import protocol as P
from .models import LOADING, READY, UNAVAILABLE, ModelVersion

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger("tritond.broker")

STOP_GRACE_S = 10.0
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


class ControlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.err = P.Err(code, message)


class ControlHandler:
    def __init__(self, broker: "Broker") -> None:
        self.b = broker
        self.regions = RegionTable()
        self.log_settings: dict[str, Any] = {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": int(broker.opts.get("log_verbose", 0)), "log_format": "default",
        }
        self.trace_settings: dict[str, Any] = {
            "trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": "triton",
        }
        self.model_trace: dict[str, dict[str, Any]] = {}
        self.waiting_loads: list[tuple[tuple, int, str]] = []
        self.drain_waiters: list[tuple[tuple, int]] = []
        self.drain_deadline = 0.0
        self.stop_at = 0.0
        self.cancelled = False

    # ---------------------------------------------------------------- dispatch

    def handle(self, src: tuple[zmq.Socket, bytes], msg: P.Control) -> None:
        fn = getattr(self, "op_" + msg.op, None)
        try:
            if fn is None:
                raise ControlError("UNSUPPORTED", f"unknown control operation '{msg.op}'")
            result = fn(src, msg.cid, msg.args)
        except ControlError as e:
            self.reply(src, msg.cid, error=e.err)
            return
        except RegionError as e:
            self.reply(src, msg.cid, error=P.Err(e.code, e.message))
            return
        except (KeyError, TypeError, ValueError, AttributeError):
            log.warning("control '%s' with malformed arguments", msg.op, exc_info=True)
            self.reply(src, msg.cid, error=P.Err("INVALID_ARG", f"malformed arguments for '{msg.op}'"))
            return
        if result is not _DEFERRED:
            self.reply(src, msg.cid, result)

    def reply(self, src, cid: int, result: Any = None, error: P.Err | None = None) -> None:
        sock, ident = src
        sock.send_multipart([ident, P.encode(P.ControlReply(cid, result, error))])

    # ---------------------------------------------------------------- lifecycle hooks

    def startup_models(self, names: list[str]) -> set[str]:
        mode = self.b.opts.get("model_control_mode", "none")
        if mode != "explicit":
            return set(names)
        wanted = list(self.b.opts.get("load_models") or [])
        if "*" in wanted:
            return set(names)
        return set(wanted)

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
        mv.config = config_to_json(cfg)
        self.b.table_dirty = True
        return ""

    def tick(self, now: float) -> None:
        if self.waiting_loads:
            still = []
            for src, cid, name in self.waiting_loads:
                versions = self.b.models.get(name, {})
                if any(mv.state == LOADING for mv in versions.values()):
                    still.append((src, cid, name))
                    continue
                failed = [mv for mv in versions.values() if mv.state != READY]
                if failed:
                    text = "".join(
                        f"load failed for model '{name}': version {mv.version} is at UNAVAILABLE state: {mv.reason};\n"
                        for mv in failed)
                    self.reply(src, cid, error=P.Err("INVALID_ARG", text))
                else:
                    self.reply(src, cid, {})
            self.waiting_loads = still
        b = self.b
        if b.stopping and b.running:
            idle = not b.inflight and all(
                mv.scheduler is None or not len(mv.scheduler)
                for vs in b.models.values() for mv in vs.values())
            if idle or now >= self.drain_deadline:
                for src, cid in self.drain_waiters:
                    self.reply(src, cid, {"drained": idle and not self.cancelled})
                self.drain_waiters = []
                if not idle:
                    self.cancelled = True
                    self.cancel_all("Server is shutting down: the exit timeout expired")
                if self.stop_at == 0.0 and self.b.opts.get("_stop_after_drain"):
                    self.stop_at = now + STOP_GRACE_S
            if self.stop_at and (now >= self.stop_at or os.getppid() != self.b.opts.get("supervisor_pid")):
                b.running = False

    def begin_stop(self) -> None:
        """SIGTERM to the broker: drain within the exit timeout, then stop unless the
        supervisor (which usually got the same signal) stops us first; at once when the
        supervisor is gone (its death sends this SIGTERM), since nobody else will."""
        self.b.opts["_stop_after_drain"] = True
        self.start_drain()

    def start_drain(self) -> None:
        if not self.b.stopping:
            self.b.stopping = True
            self.b.table_dirty = True
            self.drain_deadline = time.monotonic() + float(self.b.opts.get("exit_timeout_secs", 30))

    def cancel_all(self, message: str) -> None:
        b = self.b
        err = P.Err("UNAVAILABLE", message)
        for vs in b.models.values():
            for mv in vs.values():
                b.fail_queued(mv, err)
        for bid, reqs in list(b.inflight.items()):
            for r in reqs:
                b.finish(r, P.InferReply(r.msg.rid, error=err), False)
        b.inflight.clear()

    # ---------------------------------------------------------------- regions

    def resolve_regions(self, msg: P.Infer) -> tuple[list, P.Err | None]:
        """Bounds-check every tensor placed in a client region and point its descriptor at
        the region's location; the regions stay in use until `release_regions`."""
        used = []
        try:
            for d in msg.inputs:
                if d.region:
                    region, off = self.regions.resolve(d.region, d.offset, d.nbytes)
                    d.seg, d.offset = region.location, off
                    used.append(region)
            for o in msg.outputs:
                if o.region:
                    region, off = self.regions.resolve(o.region, o.offset, o.nbytes)
                    o.seg, o.offset = region.location, off
                    used.append(region)
        except RegionError as e:
            return [], P.Err(e.code, e.message)
        for r in used:
            self.regions.acquire(r)
        return used, None

    def release_regions(self, regions: list) -> None:
        keys: list[str] = []
        for r in regions:
            keys += self.regions.release(r)
        if keys:
            self.unmap(keys)

    def unmap(self, keys: list[str]) -> None:
        """Tell every worker to drop its mappings of client regions nobody uses any more."""
        frame = P.encode(P.Unmap(keys))
        for ident in list(self.b.by_identity):
            if not ident.endswith(b":hb"):
                self.b.wk.send_multipart([ident, frame])

    def _require_shm(self) -> None:
        if not self.b.opts.get("allow_client_shm", False):
            raise ControlError(
                "UNSUPPORTED",
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.")

    def op_shm_register(self, src, cid, a):
        self._require_shm()
        self.regions.register(str(a.get("name", "")), a.get("key", ""), a.get("offset", 0), a.get("byte_size", 0))
        return {}

    def op_shm_unregister(self, src, cid, a):
        self._require_shm()
        keys = self.regions.unregister(a.get("name") or None, SYSTEM)
        if keys:
            self.unmap(keys)
        return {}

    def op_shm_status(self, src, cid, a):
        return self.regions.status(a.get("name") or None, SYSTEM)

    def op_cuda_register(self, src, cid, a):
        """Workers open the IPC handle on first use; the broker never loads CUDA, it only
        checks (cheaply, via nvidia-smi) that the device exists."""
        self._require_shm()
        name = str(a.get("name", ""))
        handle = a.get("raw_handle", b"")
        if not isinstance(handle, bytes) or len(handle) != CUDA_HANDLE_BYTES:
            raise ControlError("INVALID_ARG", "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        device_id = a.get("device_id", 0)
        count = gpu_count()
        if count == 0:
            raise ControlError("INVALID_ARG", f"failed to register CUDA shared memory region: '{name}', GPUs not supported")
        if not isinstance(device_id, int) or isinstance(device_id, bool) or not 0 <= device_id < count:
            raise ControlError("INVALID_ARG", f"failed to register shared memory region '{name}': invalid args")
        self.regions.register_cuda(name, a.get("raw_handle", b""), device_id, a.get("byte_size", 0))
        return {}

    def op_cuda_unregister(self, src, cid, a):
        self._require_shm()
        keys = self.regions.unregister(a.get("name") or None, CUDA)
        if keys:
            self.unmap(keys)
        return {}

    def op_cuda_status(self, src, cid, a):
        return self.regions.status(a.get("name") or None, CUDA)

    # ---------------------------------------------------------------- repository

    def op_index(self, src, cid, a):
        ready_only = bool(a.get("ready", False))
        out = []
        for name in self.b.names:
            versions = self.b.models.get(name)
            if not versions:
                if not ready_only:
                    out.append({"name": name})
                continue
            for v, mv in sorted(versions.items()):
                if ready_only and mv.state != READY:
                    continue
                entry = {"name": name, "version": str(v) if v > 0 else "", "state": mv.state}
                if mv.reason:
                    entry["reason"] = mv.reason
                out.append(entry)
        return out

    def op_load(self, src, cid, a):
        if self.b.opts.get("model_control_mode", "none") != "explicit":
            raise ControlError("UNAVAILABLE", NOT_EXPLICIT)
        name = a["name"]
        if a.get("files"):
            if "config" not in a:
                raise ControlError("INVALID_ARG", "Load parameter 'config' must be specified for model file override")
            raise ControlError("UNSUPPORTED", "model file overrides ('file:' load parameters) are not supported")
        override = None
        if "config" in a:
            try:
                override = config_from_json(json.loads(a["config"]) if isinstance(a["config"], str) else a["config"])
            except (ValueError, TypeError) as e:
                raise ControlError("INVALID_ARG", f"failed to parse the 'config' load parameter: {e}") from None
        sources = scan(self.b.opts["model_repositories"])
        self.b.names = sorted(sources)
        self.b.table_dirty = True
        if name not in sources:
            raise ControlError("INTERNAL", f"failed to load '{name}', failed to poll from model repository")
        versions = self.b.models.get(name)
        if override is None and versions and all(mv.state == READY for mv in versions.values()):
            return {}
        if versions:
            self.unload(name)
        self.b.ensembles.load_dependencies(sources, name)
        self.b.load_model(sources[name], override)
        self.waiting_loads.append((src, cid, name))
        return _DEFERRED

    def unload(self, name: str) -> None:
        for mv in self.b.models.get(name, {}).values():
            self.b.fail_queued(mv, P.Err("UNAVAILABLE", f"model '{name}' is being unloaded"))
            for inst in mv.instances:
                if inst.proc is not None and inst.proc.poll() is None:
                    inst.state = "STOPPING"
                    self.b.wk.send_multipart([inst.identity, P.encode(P.Stop())])
            self.b.set_state(mv, UNAVAILABLE, "unloaded")

    def op_unload(self, src, cid, a):
        if self.b.opts.get("model_control_mode", "none") != "explicit":
            raise ControlError("UNAVAILABLE", NOT_EXPLICIT)
        dependents = self.b.ensembles.dependencies(a["name"]) if a.get("unload_dependents") else []
        for name in [a["name"], *dependents]:
            self.unload(name)
        return {}

    # ---------------------------------------------------------------- statistics

    def op_stats(self, src, cid, a):
        name = a.get("name") or ""
        version = int(a.get("version", -1))
        if not name:
            return [mv.stats.as_dict() for vs in self.b.models.values() for mv in vs.values() if mv.state == READY]
        versions = self.b.models.get(name)
        if versions is None or not any(mv.state == READY for mv in versions.values()):
            _, err = self.b.resolve(name, version)
            if err is None:
                err = P.Err("NOT_FOUND", f"'{name}' has no available versions")
            raise ControlError(err.code, err.message)
        if version >= 0:
            mv, err = self.b.resolve(name, version)
            if err is not None:
                raise ControlError(err.code, err.message)
            return [mv.stats.as_dict()]
        return [mv.stats.as_dict() for v, mv in sorted(versions.items()) if mv.state == READY]

    def op_metrics(self, src, cid, a):
        out = []
        for vs in self.b.models.values():
            for mv in vs.values():
                d = mv.stats.as_dict()
                d["pending"] = len(mv.scheduler) if mv.scheduler else 0
                d["instances_ready"] = len(mv.serving())
                d["state"] = mv.state
                out.append(d)
        return out

    # ---------------------------------------------------------------- settings

    def op_log_settings(self, src, cid, a):
        updates = a.get("settings") or {}
        if updates.get("log_file") not in (None, ""):
            raise ControlError("UNSUPPORTED", "log file location can not be updated through network protocol")
        for key in ("log_info", "log_warning", "log_error"):
            if key in updates:
                if not isinstance(updates[key], bool):
                    raise ControlError("INVALID_ARG", f"expect boolean for '{key}'")
                self.log_settings[key] = updates[key]
        if "log_verbose_level" in updates:
            v = updates["log_verbose_level"]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ControlError("INVALID_ARG", "expect unsigned integer for 'log_verbose_level'")
            self.log_settings["log_verbose_level"] = v
        if "log_format" in updates:
            fmt = updates["log_format"]
            if fmt not in ("default", "ISO8601"):
                raise ControlError("UNAVAILABLE", f"invalid argument for --log_format, got: {fmt}")
            self.log_settings["log_format"] = fmt
        return self.log_settings

    def op_trace_settings(self, src, cid, a):
        model = a.get("model") or ""
        updates = a.get("settings") or {}
        if "trace_file" in updates and updates["trace_file"] not in (None, "", []):
            raise ControlError("INVALID_ARG", "trace file location can not be updated through network protocol")
        if model and model not in self.b.models:
            _, err = self.b.resolve(model, -1)
            raise ControlError(err.code, err.message)
        base = self.trace_settings
        target = self.model_trace.setdefault(model, {}) if model else base
        for k, v in updates.items():
            if k not in base:
                raise ControlError("INVALID_ARG", f"unknown trace setting '{k}'")
            if v is None:
                target.pop(k, None) if model else None
            else:
                target[k] = v
        return {**base, **(self.model_trace.get(model, {}) if model else {})}

    # ---------------------------------------------------------------- shutdown

    def op_drain(self, src, cid, a):
        self.start_drain()
        self.drain_waiters.append((src, cid))
        return _DEFERRED

    def op_stop(self, src, cid, a):
        self.b.running = False
        return {}


_DEFERRED = object()
