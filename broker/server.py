"""The broker: the one process that decides.

It owns the model table, every queue and every worker process. One thread runs one loop:
poll the frontend socket, the worker socket, every worker's pidfd and a signal pipe; then
dispatch batches to free instances and fire timers. It never touches tensor bytes.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from tritond.repository.catalog import ModelSpec, load_spec
from tritond.repository.layout import scan
from tritond.repository.parameters import config_parameter
from tritond.repository.render import config_to_json
from tritond.shm.naming import PREFIX, owner_prefix, sweep

from . import pool, protocol as P
from .addresses import Addresses
from .control import ControlHandler
from .ensemble import Ensembles
from .models import LOADING, READY, UNAVAILABLE, ModelVersion
from .pool import Instance
from .scheduler import BatchPolicy, Pending, Rejected, Scheduler

log = logging.getLogger("tritond.broker")

HEARTBEAT_TIMEOUT_S = 3.0
PING_INTERVAL_S = 0.5
LOAD_TIMEOUT_S = 300.0


@dataclass
class Req:
    """A request the broker has admitted and still owes an answer."""
    src: tuple[zmq.Socket, bytes]
    msg: P.Infer
    mv: ModelVersion
    arrival_ns: int
    pending: Pending
    dispatch_ns: int = 0
    order: int = -1
    retried: bool = False
    regions: list = field(default_factory=list)


def request_prefix(req_id: str) -> str:
    return f"[request id: {req_id or '<id_unknown>'}] "


class Broker:
    def __init__(self, opts: dict[str, Any]) -> None:
        self.opts = opts
        self.server_id: str = opts["server_id"]
        self.addr = Addresses(opts["run_dir"])
        self.ctx = zmq.Context()
        self.fe = self._router(self.addr.frontends)
        self.wk = self._router(self.addr.workers)
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.names: list[str] = []
        self.specs: dict[str, ModelSpec] = {}
        self.frontends: set[bytes] = set()
        self.by_identity: dict[bytes, Instance] = {}
        self.by_pidfd: dict[int, Instance] = {}
        self.inst_model: dict[int, ModelVersion] = {}
        self.inflight: dict[int, list[Req]] = {}   # batch id -> requests
        self.bid = 0
        self.epoch = 0
        self.startup_done = False
        self.stopping = False
        self.running = True
        self.table_dirty = True
        self.next_ping = 0.0
        self.next_check = 0.0
        self.fe_decoder = P.decoder(P.FrontendMsg)
        self.wk_decoder = P.decoder(P.WorkerMsg)
        self.control = ControlHandler(self)
        self.ensembles = Ensembles(self)
        self.sig_r, sig_w = os.pipe()
        os.set_blocking(sig_w, False)
        signal.set_wakeup_fd(sig_w)
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _router(self, endpoint: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME)
        s.setsockopt(zmq.ROUTER_MANDATORY, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.bind(endpoint)
        return s

    # ------------------------------------------------------------------ loading

    def load_all(self) -> None:
        sources = scan(self.opts["model_repositories"])
        self.names = sorted(sources)
        wanted = self.control.startup_models(self.names)
        for name in self.ensembles.load_order(sources, wanted):
            self.load_model(sources[name])
        self.table_dirty = True

    def load_model(self, source, override=None) -> None:
        """Load every selected version of a model; `override` (a ModelConfig) replaces its
        config.pbtxt for this load, as a repository load request's `config` parameter does."""
        spec = load_spec(
            source,
            autocomplete=not self.opts.get("disable_auto_complete", False),
            default_max_batch_size=self.opts.get("default_max_batch_size", 4),
            config_name=self.opts.get("model_config_name", ""),
            override=override,
        )
        self.specs[spec.name] = spec
        for line in spec.advice:
            log.warning(line)
        if spec.error:
            log.error("failed to load '%s': %s", spec.name, spec.error)
            versions = spec.versions or [0]
            self.models[spec.name] = {
                v: ModelVersion(spec.name, v, spec.path, "", None, UNAVAILABLE, spec.error)
                for v in versions
            }
            return
        config = config_to_json(spec.config)
        self.models[spec.name] = {}
        for v in spec.versions:
            if config.get("platform") == "ensemble":
                self.models[spec.name][v] = self.ensembles.setup(spec, v, config)
                continue
            mv = ModelVersion(spec.name, v, spec.path, os.path.dirname(spec.path), config)
            self.models[spec.name][v] = mv
            index = 0
            for g, group in enumerate(config.get("instance_group") or []):
                kind = str(group.get("kind", "KIND_CPU")).replace("KIND_", "")
                # As Triton: a GPU group has `count` instances on each of its GPUs.
                devices = [int(d) for d in group.get("gpus") or [0]] if kind == "GPU" else [0]
                name = group.get("name") or f"{spec.name}_{g}"
                for i, device in enumerate(d for d in devices for _ in range(int(group.get("count", 1)))):
                    mv.instances.append(Instance(spec.name, v, index, f"{name}_{i}", kind=kind, device_id=device))
                    index += 1
            for inst in mv.instances:
                self.start_instance(mv, inst)

    def worker_spec(self, mv: ModelVersion, inst: Instance) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "workers": self.addr.workers,
            "model": mv.name,
            "version": mv.version,
            "model_dir": mv.model_dir,
            "version_dir": os.path.join(mv.model_dir, str(mv.version)),
            "repository": mv.repo,
            "config": mv.config,
            "instance_name": inst.name,
            "kind": inst.kind,
            "device_id": inst.device_id,
            "log_verbose": self.opts.get("log_verbose", 0),
        }

    def start_instance(self, mv: ModelVersion, inst: Instance) -> None:
        """Spawn a (new generation of a) worker; it gets work only once it says WorkerUp."""
        self.by_identity.pop(inst.identity, None)
        self.by_identity.pop(inst.identity + b":hb", None)
        env = None
        if inst.kind == "GPU":
            # Set before any CUDA import in the worker: its GPU, and under --mps the server's daemon
            # with the model's SM share (parameter mps_active_thread_percentage; the worker checks it).
            visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            device = visible[inst.device_id] if inst.device_id < len(visible) else str(inst.device_id)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=device, **self.opts.get("mps_env", {}))
            share = config_parameter(mv.config, "mps_active_thread_percentage")
            if share and "mps_env" in self.opts:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = share
        pool.spawn(inst, self.worker_spec(mv, inst), env)
        inst.batch_started = time.monotonic()
        self.by_identity[inst.identity] = inst
        self.by_identity[inst.identity + b":hb"] = inst
        self.by_pidfd[inst.pidfd] = inst
        self.inst_model[id(inst)] = mv

    # ------------------------------------------------------------------ state

    def resolve(self, name: str, version: int) -> tuple[ModelVersion | None, P.Err | None]:
        """Triton's model/version lookup with its exact error texts."""
        versions = self.models.get(name)
        if versions is None:
            if name in self.names:
                return None, P.Err("NOT_FOUND", f"'{name}' is not found")
            return None, P.Err("INVALID_ARG", f"Request for unknown model: '{name}' is not found")
        if version >= 0:
            mv = versions.get(version)
            if mv is None:
                return None, P.Err("NOT_FOUND", f"'{name}' version {version} is not found")
            if mv.state != READY:
                return None, P.Err("UNAVAILABLE", f"'{name}' version {version} is not at ready state")
            return mv, None
        ready = [v for v, mv in versions.items() if mv.state == READY]
        if not ready:
            return None, P.Err("NOT_FOUND", f"'{name}' has no available versions")
        return versions[max(ready)], None

    def set_state(self, mv: ModelVersion, state: str, reason: str = "") -> None:
        if mv.state != state or mv.reason != reason:
            mv.state, mv.reason = state, reason
            self.table_dirty = True
            if state == UNAVAILABLE and reason:
                log.error("model '%s' version %d is UNAVAILABLE: %s", mv.name, mv.version, reason)
            elif state == READY:
                log.info("model '%s' version %d is READY", mv.name, mv.version)

    def table(self) -> P.Table:
        entries = [
            P.ModelEntry(mv.name, mv.version, mv.state, mv.reason, mv.config)
            for versions in self.models.values()
            for mv in versions.values()
        ]
        return P.Table(self.epoch, entries, self.names, self.startup_done, self.stopping, os.getpid())

    def broadcast_table(self) -> None:
        self.epoch += 1
        frame = P.encode(self.table())
        for ident in self.frontends:
            self.fe.send_multipart([ident, frame])
        self.table_dirty = False

    def check_startup(self) -> None:
        if self.startup_done:
            return
        if all(mv.state != LOADING for vs in self.models.values() for mv in vs.values()):
            self.startup_done = True
            self.table_dirty = True

    def update_model_state(self, mv: ModelVersion) -> None:
        """Derive the model state from its instances (load finished, crashed, restarted):
        READY while any instance can serve, else UNAVAILABLE with the reason."""
        if mv.state == UNAVAILABLE and mv.reason == "unloaded":
            return
        if mv.config and mv.config.get("platform") == "ensemble":
            return
        serving = mv.serving()
        if mv.state == LOADING:
            if any(i.state == "FAILED" for i in mv.instances):
                return
            if len(serving) == len(mv.instances):
                self.finish_load(mv)
            return
        reasons = "; ".join(sorted({i.last_error for i in mv.instances if i.last_error}))
        if serving:
            self.set_state(mv, READY)
        elif all(i.state == "FAILED" for i in mv.instances):
            self.set_state(mv, UNAVAILABLE, f"every instance of model '{mv.name}' failed: {reasons}")
            self.fail_queued(mv, P.Err("UNAVAILABLE", f"model '{mv.name}' is unavailable: {reasons}"))
        else:
            self.set_state(mv, UNAVAILABLE, f"model '{mv.name}' has no live instance (restarting): {reasons}")

    def finish_load(self, mv: ModelVersion) -> None:
        mv.scheduler = Scheduler(BatchPolicy.from_config(mv.config or {}))
        self.set_state(mv, READY)
        self.check_startup()

    def fail_load(self, mv: ModelVersion, reason: str) -> None:
        """A first load failed: the model is UNAVAILABLE with the reason; nothing restarts."""
        for inst in mv.instances:
            inst.state = "FAILED"
            pool.kill(inst)
        self.set_state(mv, UNAVAILABLE, reason)
        self.check_startup()

    # ------------------------------------------------------------------ requests

    def send_reply(self, src, reply: P.InferReply) -> None:
        """Answer a request: src is (socket, identity), or a callable for internal callers (ensembles)."""
        if callable(src):
            src(reply)
            return
        sock, ident = src
        sock.send_multipart([ident, P.encode(reply)])

    def reject(self, src, msg: P.Infer, err: P.Err) -> None:
        self.send_reply(src, P.InferReply(msg.rid, error=err))

    def untrusted_locations(self, msg: P.Infer) -> P.Err | None:
        """A request from a frontend or a model names memory by region or by one of this
        server's segments only; device handles, leases and output targets are the broker's
        to set, so whatever the sender put there is discarded."""
        own = f"/{PREFIX}{self.server_id}."
        for d in msg.inputs:
            if any(x < 0 for x in d.shape):
                return P.Err("INVALID_ARG", f"invalid shape for input '{d.name}': negative dimension")
            d.cuda_handle, d.device, d.lease = b"", 0, 0
            if not d.region and d.data is None and not d.seg.startswith(own):
                return P.Err("INVALID_ARG", f"input '{d.name}' has no data")
        for o in msg.outputs:
            o.device_ok = False
            if not o.region:
                o.seg, o.offset, o.nbytes = "", 0, 0
        return None

    def on_infer(self, src: tuple[zmq.Socket, bytes], msg: P.Infer) -> None:
        bls = src[0] is self.wk     # a model's call to another model, made by a request in flight
        if self.stopping and not bls:
            return self.reject(src, msg, P.Err("UNAVAILABLE", "Server is shutting down and has stopped accepting new requests"))
        err = self.untrusted_locations(msg)
        if err is not None:
            return self.reject(src, msg, err)
        mv, err = self.resolve(msg.model, msg.version)
        if err is not None:
            return self.reject(src, msg, err)
        if bls:                     # refused when it could never be answered
            src = self.ensembles.bls_call(src, msg, mv)
            if src is None:
                return
        if mv.config.get("platform") == "ensemble":
            self.ensembles.run(src, msg, mv)
            return
        self.admit(src, msg, mv)

    def admit(self, src, msg: P.Infer, mv: ModelVersion) -> Req | None:
        """Queue a request on the model's scheduler (or answer it at once when it cannot wait)."""
        regions, err = self.control.resolve_regions(msg)
        if err is not None:
            self.reject(src, msg, err)
            return None
        sched = mv.scheduler
        bs = msg.inputs[0].shape[0] if mv.max_batch_size > 0 and msg.inputs and msg.inputs[0].shape else 1
        now = time.monotonic_ns()
        req = Req(src, msg, mv, now, Pending(None, now, bs, sched.policy.shape_key(msg.inputs)), regions=regions)
        req.pending.key = req
        try:
            sched.enqueue(req.pending, msg.priority, msg.timeout_us, now)
        except Rejected as e:
            self.control.release_regions(regions)
            self.reject(src, msg, P.Err("UNAVAILABLE", request_prefix(msg.id) + str(e)))
            return None
        self.dispatch(mv)
        return req

    def dispatch(self, mv: ModelVersion) -> None:
        """Form batches while an instance is free; each goes to the least busy free instance."""
        sched = mv.scheduler
        if sched is None:
            return
        while len(sched):
            free = mv.free_instances()
            if not free:
                return
            now = time.monotonic_ns()
            self.expire_queued(mv, now)
            batch, wake = sched.next_batch(now)
            if not batch:
                mv.wake_ns = wake
                return
            mv.wake_ns = 0
            self.send_batch(mv, sched.pick_instance(free), [p.key for p in batch], now)

    def expire_queued(self, mv: ModelVersion, now_ns: int) -> None:
        """Answer requests whose queue timeout passed under a REJECT policy."""
        deadline = mv.scheduler.next_deadline()
        if deadline and deadline < now_ns:
            for p in mv.scheduler.expire(now_ns):
                self.finish(p.key, P.InferReply(p.key.msg.rid, error=P.Err("UNAVAILABLE", "Request timeout expired")), False)

    def send_batch(self, mv: ModelVersion, inst: Instance, reqs: list[Req], now_ns: int) -> None:
        self.bid += 1
        for r in reqs:
            r.dispatch_ns = now_ns
            if mv.scheduler.policy.preserve_ordering and r.order < 0:
                r.order = mv.dispatch_seq
                mv.dispatch_seq += 1
        exec_msg = P.Exec(self.bid, [
            P.ExecRequest(r.msg.inputs, r.msg.outputs, r.msg.id, r.msg.params,
                          r.msg.correlation_id, r.msg.flags, r.msg.timeout_us)
            for r in reqs
        ])
        self.inflight[self.bid] = reqs
        inst.batch = self.bid
        inst.state = "BUSY"
        inst.batch_started = time.monotonic()
        self.wk.send_multipart([inst.identity, P.encode(exec_msg)])

    def finish(self, req: Req, reply: P.InferReply, ok: bool, times: tuple[int, int, int] = (0, 0, 0)) -> None:
        now = time.monotonic_ns()
        if ok:
            req.mv.stats.record_success(req.pending.batch_size, now - req.arrival_ns,
                                        req.dispatch_ns - req.arrival_ns, *times)
        else:
            req.mv.stats.record_failure(now - req.arrival_ns)
        self.control.release_regions(req.regions)
        mv = req.mv
        if req.order < 0:
            self.send_reply(req.src, reply)
            return
        mv.held[req.order] = [req.src, reply]
        while mv.send_seq in mv.held:
            src, r = mv.held.pop(mv.send_seq)
            mv.send_seq += 1
            if src is not None:
                self.send_reply(src, r)

    def on_batch_done(self, inst: Instance, msg: P.BatchDone) -> None:
        if inst.batch != msg.bid:
            return                  # not this instance's batch: a stale or confused worker
        reqs = self.inflight.pop(msg.bid, None)
        if reqs is None:
            return
        mv = self.inst_model[id(inst)]
        inst.batch = None
        if inst.state == "BUSY":    # a worker being killed or stopped gets no more work
            inst.state = "READY"
        inst.idle_since = time.monotonic()
        mv.scheduler.note_busy(inst.name, int((inst.idle_since - inst.batch_started) * 1e9))
        times = (msg.input_ns, msg.infer_ns, msg.output_ns)
        # Triton's onnxruntime backend reports no execution when every request of it failed;
        # its Python backend reports every execution.
        if mv.config.get("backend") == "python" or any(res.error is None for res in msg.results):
            mv.stats.record_execution(sum(r.pending.batch_size for r in reqs), *times)
        missing = P.ExecResult(error=P.Err("INTERNAL", f"model '{mv.name}' returned no result for the request"))
        for i, req in enumerate(reqs):
            res = msg.results[i] if i < len(msg.results) else missing
            reply = P.InferReply(req.msg.rid, mv.version, res.outputs, res.error, inst.identity)
            self.finish(req, reply, res.error is None, times)
        self.dispatch(mv)

    def fail_queued(self, mv: ModelVersion, err: P.Err) -> None:
        if mv.scheduler is None:
            return
        for p in mv.scheduler.remove(lambda _: True):
            self.finish(p.key, P.InferReply(p.key.msg.rid, error=err), False)

    # ------------------------------------------------------------------ workers

    def on_worker_msg(self, ident: bytes, frame: bytes) -> None:
        inst = self.by_identity.get(ident)
        if inst is None:
            return  # a dead incarnation's late frame
        try:
            msg = self.wk_decoder.decode(frame)
        except P.DecodeError:
            log.warning("dropped an undecodable frame from worker %s", inst.name)
            return
        inst.last_heartbeat = time.monotonic()
        mv = self.inst_model[id(inst)]
        if isinstance(msg, P.BatchDone):
            inst.served = True
            self.on_batch_done(inst, msg)
        elif isinstance(msg, P.Heartbeat):
            pass
        elif isinstance(msg, P.WorkerUp):
            self.on_worker_up(mv, inst, msg)
        elif isinstance(msg, P.WorkerDown):
            inst.exit_reason = f"failed to initialize: {msg.reason}"
            if mv.state == LOADING:
                self.fail_load(mv, f"load failed for model '{mv.name}': {msg.reason}")
        elif isinstance(msg, P.Infer):
            self.on_infer((self.wk, inst.identity), msg)
        elif isinstance(msg, P.Release):
            self.route_release(msg)

    def on_worker_up(self, mv: ModelVersion, inst: Instance, msg: P.WorkerUp) -> None:
        if msg.config is not None and mv.state == LOADING and msg.config != mv.config:
            err = self.control.accept_completed_config(mv, msg.config)
            if err:
                self.fail_load(mv, err)
                return
        inst.state = "READY"
        inst.idle_since = time.monotonic()
        if inst.restarts:
            log.info("instance '%s' of model '%s' is serving again (restart %d, pid %d)",
                     inst.name, mv.name, inst.restarts, msg.pid)
        self.update_model_state(mv)
        self.dispatch(mv)

    def on_worker_exit(self, inst: Instance) -> None:
        """A worker process ended: answer (or retry) the batch it held, reclaim its shared
        memory, drop its identity (so late frames are ignored) and schedule its restart."""
        pid = inst.proc.pid
        rc = pool.reap(inst)
        self.by_pidfd = {fd: i for fd, i in self.by_pidfd.items() if i is not inst}
        self.by_identity.pop(inst.identity, None)
        self.by_identity.pop(inst.identity + b":hb", None)
        prefix = owner_prefix(self.server_id, inst.owner)
        sweep(prefix)
        self.announce_gone(prefix)
        mv = self.inst_model[id(inst)]
        how = inst.exit_reason or f"died ({pool.describe_exit(rc)})"
        bid, inst.batch = inst.batch, None
        lost = self.inflight.pop(bid, []) if bid is not None else []
        retried = self.fail_batch(mv, lost, f"inference failed because model '{mv.name}' instance '{inst.name}' {how}")
        if inst.state in ("STOPPING", "STOPPED") or not self.running or mv.reason == "unloaded":
            inst.state = "STOPPED"
            return
        log.error("model '%s' instance '%s' (pid %d) %s; its batch held %d request(s): %d failed, %d retried",
                  mv.name, inst.name, pid, how, len(lost), len(lost) - retried, retried)
        inst.last_error = f"instance '{inst.name}' {how}"
        if inst.state == "FAILED":
            return
        if mv.state == LOADING:
            self.fail_load(mv, f"load failed for model '{mv.name}': instance '{inst.name}' {how}")
            return
        if pool.record_crash(inst, time.monotonic()):
            inst.state = "RESTARTING"
        else:
            inst.state = "FAILED"
            inst.last_error = (f"instance '{inst.name}' failed {len(inst.crashes)} times within "
                               f"{pool.CRASH_WINDOW:g} s without serving and is not restarted; last: {how}")
            log.error("model '%s' %s", mv.name, inst.last_error)
        self.update_model_state(mv)
        self.dispatch(mv)

    def announce_gone(self, prefix: str) -> None:
        """Frontends and workers that mapped a dead worker's segments let go of them, so the
        memory is freed rather than held by their mappings."""
        frame = P.encode(P.Gone(prefix))
        for ident in self.frontends:
            self.fe.send_multipart([ident, frame])
        for ident in self.by_identity:
            if not ident.endswith(b":hb"):
                self.wk.send_multipart([ident, frame])

    def fail_batch(self, mv: ModelVersion, reqs: list[Req], message: str) -> int:
        """Answer the requests of a batch whose worker died; an idempotent model's requests
        go back to the head of the queue once. Returns how many were retried."""
        retried = 0
        for r in reqs:
            if mv.idempotent and not r.retried and mv.scheduler is not None and self.running:
                r.retried = True
                r.dispatch_ns = 0
                mv.scheduler.requeue_front(r.pending)
                retried += 1
            else:
                self.finish(r, P.InferReply(r.msg.rid, error=P.Err("UNAVAILABLE", message)), False)
        return retried

    def route_release(self, msg: P.Release) -> None:
        if self.ensembles.release_handover(msg):
            return
        inst = self.by_identity.get(msg.owner)
        if inst is not None:
            self.wk.send_multipart([msg.owner, P.encode(msg)])

    # ------------------------------------------------------------------ frontends

    def on_frontend_msg(self, ident: bytes, frame: bytes) -> None:
        try:
            msg = self.fe_decoder.decode(frame)
        except P.DecodeError:
            log.warning("dropped an undecodable frame from a frontend")
            return
        if ident not in self.frontends:     # a new frontend, or one that outlived our predecessor
            self.frontends.add(ident)
            self.fe.send_multipart([ident, P.encode(self.table())])
            if isinstance(msg, P.Hello):
                return
        if isinstance(msg, P.Infer):
            self.on_infer((self.fe, ident), msg)
        elif isinstance(msg, P.Release):
            self.route_release(msg)
        elif isinstance(msg, P.Control):
            self.control.handle((self.fe, ident), msg)
        elif isinstance(msg, P.Hello):
            self.frontends.add(ident)
            self.fe.send_multipart([ident, P.encode(self.table())])

    # ------------------------------------------------------------------ timers

    def timers(self) -> float:
        """Fire due timers; return seconds until the next one."""
        now = time.monotonic()
        now_ns = time.monotonic_ns()
        next_s = 1.0
        for versions in self.models.values():
            for mv in versions.values():
                sched = mv.scheduler
                if sched is None or not len(sched):
                    continue
                self.expire_queued(mv, now_ns)
                deadline = sched.next_deadline()
                if mv.wake_ns and mv.wake_ns <= now_ns:
                    mv.wake_ns = 0
                    self.dispatch(mv)
                for t in (deadline, mv.wake_ns):
                    if t:
                        next_s = min(next_s, max(0.0, (t - now_ns) / 1e9))
        if 0.0 < next_s < 0.001:
            self.wait_briefly(next_s)
            next_s = 0.0
        if now >= self.next_check:
            self.next_check = now + 0.25
            self.check_instances(now)
        if now >= self.next_ping:
            self.next_ping = now + PING_INTERVAL_S
            frame = P.encode(P.Ping(os.getpid()))
            for ident in self.frontends:
                self.fe.send_multipart([ident, frame])
        self.control.tick(now)
        return min(next_s, self.next_check - now, self.next_ping - now)

    def wait_briefly(self, seconds: float) -> None:
        """Wait out a batcher delay shorter than the poller's 1 ms resolution without spinning;
        a message arriving meanwhile ends the wait."""
        socks = (self.fe, self.wk)
        if any(s.getsockopt(zmq.EVENTS) & zmq.POLLIN for s in socks):
            return
        select.select([s.getsockopt(zmq.FD) for s in socks], [], [], seconds)

    def check_instances(self, now: float) -> None:
        """Restart instances whose backoff ended; kill hung, overrunning or stuck workers
        (the pidfd then reports the death and on_worker_exit takes over).

        Silence is judged only when no worker message waits unread: after a slow loop turn
        the heartbeats are in the socket, not missing."""
        judge_silence = not self.wk.getsockopt(zmq.EVENTS) & zmq.POLLIN
        for versions in self.models.values():
            for mv in versions.values():
                for inst in mv.instances:
                    if inst.state == "RESTARTING":
                        if now >= inst.restart_at and self.running:
                            inst.restarts += 1
                            mv.stats.restarts += 1
                            self.start_instance(mv, inst)
                        continue
                    reason = ""
                    silent = now - inst.last_heartbeat > HEARTBEAT_TIMEOUT_S
                    if judge_silence and inst.state in ("READY", "BUSY", "STOPPING") and silent:
                        reason = f"was killed after it sent no heartbeat for {HEARTBEAT_TIMEOUT_S:g} s (hung or stopped)"
                    elif inst.state in ("BUSY", "STOPPING") and inst.batch is not None \
                            and now - inst.batch_started > mv.exec_timeout_s:
                        reason = f"was killed after it exceeded the execution timeout of {mv.exec_timeout_s:g} s"
                    elif inst.state == "STARTING" and now - inst.batch_started > LOAD_TIMEOUT_S:
                        reason = f"was killed after it did not finish loading within {LOAD_TIMEOUT_S:g} s"
                    if reason:
                        inst.state = "KILLED"
                        inst.exit_reason = reason
                        pool.kill(inst)

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        poller = zmq.Poller()
        poller.register(self.fe, zmq.POLLIN)
        poller.register(self.wk, zmq.POLLIN)
        poller.register(self.sig_r, zmq.POLLIN)
        self.load_all()
        self.check_startup()
        registered: set[int] = set()
        while self.running:
            timeout = self.timers()
            for fd in set(self.by_pidfd) - registered:
                poller.register(fd, zmq.POLLIN)
                registered.add(fd)
            for fd in registered - set(self.by_pidfd):
                poller.unregister(fd)
                registered.discard(fd)
            if self.table_dirty:
                self.broadcast_table()
            events = dict(poller.poll(max(0, int(timeout * 1000))))
            if self.sig_r in events:
                os.read(self.sig_r, 64)
                self.control.begin_stop()
            if self.wk in events:
                self.drain(self.wk, self.on_worker_msg)
            if self.fe in events:
                self.drain(self.fe, self.on_frontend_msg)
            for fd in list(events):
                inst = self.by_pidfd.get(fd) if isinstance(fd, int) else None
                if inst is not None:
                    poller.unregister(fd)
                    registered.discard(fd)
                    self.on_worker_exit(inst)
            if self.table_dirty:
                self.broadcast_table()
        self.shutdown_workers()
        return 0

    @staticmethod
    def drain(sock: zmq.Socket, handle) -> None:
        """Handle what has arrived on a socket, at most a bounded burst per loop turn.

        Every frame is untrusted: one that breaks its handler is logged and dropped, and
        the broker (with every model it serves) carries on."""
        for _ in range(256):
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return
            parts = sock.recv_multipart(zmq.NOBLOCK)
            if len(parts) != 2:
                log.warning("dropped a message of %d frames", len(parts))
                continue
            try:
                handle(*parts)
            except Exception:
                log.exception("dropped a message that could not be handled")

    def shutdown_workers(self) -> None:
        """Stop every worker: a busy one is killed at once (its requests were answered when
        the drain ended), an idle one is asked to stop and killed if it does not within
        5 s; then every worker segment is reclaimed."""
        live = [i for vs in self.models.values() for mv in vs.values() for i in mv.instances
                if i.proc is not None and i.proc.poll() is None]
        for inst in live:
            if inst.state in ("BUSY", "KILLED"):
                pool.kill(inst)
            else:
                self.wk.send_multipart([inst.identity, P.encode(P.Stop())])
            inst.state = "STOPPING"
        deadline = time.monotonic() + 5.0
        for inst in live:
            try:
                inst.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pool.kill(inst)
                inst.proc.wait()
        sweep(f"{PREFIX}{self.server_id}.w")
        self.fe.close()
        self.wk.close()
        self.ctx.term()
