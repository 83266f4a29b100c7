"""The broker: the one process that decides.

It owns the model table, every queue and every worker process. One thread runs one loop:
poll the frontend socket, the worker socket, every worker's pidfd and a signal pipe; decode
what arrived and hand it to the part that owns it; fire timers. It never touches tensor bytes.

The state lives in tables that hold no reference back to the broker (registry, instances,
in-flight requests, client regions); the parts that act on them (request path, lifecycle,
supervision, ensembles, BLS, control) receive the tables and callables to send with. The
broker is built without binding anything when given stand-in sockets and worker processes,
which is how the in-process tests drive it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
from typing import Any, Protocol

import zmq

from tritond import logs
from tritond.shm.naming import PREFIX, owner_prefix, sweep
from tritond.wire import schema as S
from tritond.wire.options import ServerOptions
from tritond.wire.replies import ControlResult
from tritond.wire.errors import REQUEST_CANCELLED, Code, TritonError, invalid, unavailable

from tritond.broker.scheduling.bls import BlsCalls
from tritond.broker.scheduling.cache import OWNER as CACHE_OWNER, ResponseCache
from tritond.broker.tables.client_regions import ClientRegions
from tritond.broker.clock import Clock
from tritond.broker.control import ControlHandler
from tritond.broker.drain import Drain
from tritond.broker.ensembles.submission import Ensembles
from tritond.broker.tables.frontend_leases import FrontendLeases
from tritond.broker.tables.inflight import InflightTable, ReplyTo, Req
from tritond.broker.tables.instances import InstanceTable
from tritond.broker.lifecycle.jobs import Jobs
from tritond.broker.lifecycle.version_state import Lifecycle
from tritond.broker.lifecycle.readiness import Readiness
from tritond.broker.observe.custom_metrics import METRIC_OPS, CustomMetrics
from tritond.broker.tables.live_requests import LiveRequests
from tritond.broker.observe.metrics import latency_factory, snapshot
from tritond.broker.lifecycle.operations import ModelControl
from tritond.broker.supervision.pool import Instance, InstanceState, WorkerProcesses
from tritond.broker.scheduling.rate_limiter import RateLimiter, parse_resources
from tritond.broker.tables.registry import ModelRegistry
from tritond.broker.scheduling.path import RequestPath, untrusted
from tritond.broker.lifecycle.runner import OpRunner
from tritond.broker.supervision.restart_wait import RestartWait
from tritond.broker.settings import Settings
from tritond.broker.shards.fanout import Fanout
from tritond.broker.shards.links import PeerLinks
from tritond.broker.shards.secondaries import Secondaries
from tritond.broker.sockets import BrokerSockets
from tritond.broker.scheduling.streams import Streams
from tritond.broker.supervision.watch import Supervision
from tritond.broker.observe.tracing import Tracer

log = logging.getLogger("tritond.broker")

PING_INTERVAL_S = 0.5
CHECK_INTERVAL_S = 0.25
# The models' timers are walked at least this often even when no alarm is set: a restart's
# wait bound (supervision/restart_wait.py) is checked then.
TIMER_WALK_NS = 1_000_000_000
STOP_WAIT_S = 5.0
PAGED_PUBLISH_GAP_S = 0.2
SHUTTING_DOWN = "Server is shutting down and has stopped accepting new requests"
# What a model may ask of the server itself (pb_utils.load_model, unload_model, is_model_ready).
MODEL_CONTROL = (S.LoadModel, S.UnloadModel, S.ModelReady)


class Sockets(Protocol):
    def to_frontend(self, ident: bytes, frame: bytes) -> None: ...
    def to_worker(self, ident: bytes, frame: bytes) -> None: ...
    def worker_pending(self) -> bool: ...
    def wait_briefly(self, seconds: float) -> None: ...


class Broker:
    def __init__(self, opts: ServerOptions, sockets: Sockets, pool: WorkerProcesses | None = None,
                 clock: Clock | None = None, jobs: Jobs | None = None) -> None:
        self.opts = opts
        self.sockets = sockets
        self.clock = clock or Clock()
        self.pool = pool or WorkerProcesses()
        self.jobs = jobs or Jobs(opts.model_load_thread_count)
        self.server_id: str = opts.server_id
        self.own_prefix = f"/{PREFIX}{self.server_id}."
        self.boot = os.getpid()
        self.running = True
        self.exit_code = 0
        # each connected frontend's identity -> the function that answers its requests (made once)
        self.frontends: dict[bytes, ReplyTo] = {}
        self.frontend_leases = FrontendLeases()
        self.outbox: dict[bytes, list[S.InferReply]] = {}     # replies not yet sent, per frontend
        self.next_ping = 0.0
        self.next_check = 0.0
        self.fe_decoder = S.decoder(S.FrontendMsg)
        self.wk_decoder = S.decoder(S.WorkerMsg)
        self.peers: dict[bytes, tuple[str, int]] = {}     # frontend identity -> (kind, pid)
        self.broker_peers: set[bytes] = set()     # the identities the other brokers (--broker-shards) said hello with
        self.supervisors: set[bytes] = set()      # the supervisor's (it sees every broker's table)
        # Paged mode changes the table with every page-in and page-out, and a frontend decodes
        # every model's entry each time; paged models route alike in or out (restarting), so
        # the table goes out at most every PAGED_PUBLISH_GAP_S there.
        self.publish_gap_s = PAGED_PUBLISH_GAP_S if opts.model_control_mode == "paged" else 0.0
        self.next_publish = 0.0
        self.settings = Settings(opts.log, opts.trace, self.observe_changed)

        self.registry = ModelRegistry()
        self.instances = InstanceTable()
        self.inflight = InflightTable()
        self.regions = ClientRegions(self.unmap)
        self.live = LiveRequests()
        self.streams = Streams(self.to_worker, self.route_release, self.clock.now_ns)
        limiter = None
        if opts.rate_limit == "execution_count":
            limiter = RateLimiter(parse_resources(opts.rate_limit_resources))
        elif opts.rate_limit_resources:
            log.warning("--rate-limit-resource is ignored with --rate-limit=off (as tritonserver ignores it)")
        self.restart_wait = RestartWait(self.clock)
        self.requests = RequestPath(self.inflight, self.regions, self.to_worker, self.clock, self.streams,
                                    self.restart_wait.overdue, limiter)
        # several brokers share the cache size given for the server
        self.cache = ResponseCache(opts.cache_size // opts.broker_shards, self.server_id, self.registry, self.clock)
        self.tracer = Tracer(self.settings, self.clock, self.observe_changed, opts.shard)
        latency = latency_factory(opts.metrics)
        self.ensembles = Ensembles(self.registry, self.requests.admit, self.regions, self.route_release,
                                   self.clock, opts.model_config_name, self.requests.cancel, latency)
        self.ensembles.tracer = self.tracer
        self.ensembles.cache = self.cache
        self.bls = BlsCalls(self.registry, self.instances, self.to_worker, self.route_release)
        runner = OpRunner(self.jobs, opts.model_load_thread_count)
        self.lifecycle = Lifecycle(opts, self.registry, self.instances, self.pool, self.requests, self.clock,
                                   on_settle=runner.tick, latency=latency)
        self.model_ops = ModelControl(opts, self.registry, self.lifecycle, self.ensembles, runner, self.clock,
                                      limiter, opts.model_unload_timeout_secs,
                                      self.send_stop, publish=self.publish_if_changed, fatal=self.fail,
                                      server_pids=self.server_pids)
        self.supervision = Supervision(self.server_id, self.registry, self.instances, self.pool,
                                       self.lifecycle, self.requests, self.announce_gone, self.publish_if_changed,
                                       self.restart_wait)
        self.drain = Drain(opts.exit_timeout_secs)
        self.readiness = Readiness(self.sockets.to_worker, self.clock.now)
        self.custom_metrics = CustomMetrics()
        self.control = ControlHandler(opts, self.registry, self.model_ops, self.ensembles, self.regions,
                                      self.drain, self.settings, self.begin_drain, self.stop,
                                      snapshot=lambda: snapshot(self), readiness=self.readiness)
        # With several brokers (run()): links to the others; the first starts them and answers
        # control for all.
        self.links: PeerLinks | None = None
        self.secondaries: Secondaries | None = None
        self.controller: ControlHandler | Fanout = self.control

    # ------------------------------------------------------------------ sending

    def reply_frontend(self, ident: bytes, reply: S.InferReply) -> None:
        """Replies wait for the end of the loop turn: all a frontend gets in one turn (many
        streamed responses, a batch's requests) leave as one frame."""
        if reply.outputs:
            orphaned = self.frontend_leases.sent(ident, reply)
            if orphaned is not None:        # the frontend died meanwhile: free its outputs now
                self.route_release(orphaned)
                return
        self.outbox.setdefault(ident, []).append(reply)

    def end_turn(self) -> int:
        """What waits for the end of a loop turn: batches left for it, then the replies.
        Returns when a batcher wants another look (ns, 0: none)."""
        wake = self.requests.end_turn()
        self.flush_replies()
        return wake

    def flush_replies(self) -> None:
        outbox, self.outbox = self.outbox, {}
        for ident, replies in outbox.items():
            frame = S.encode(replies[0] if len(replies) == 1 else S.Replies(replies))
            self.sockets.to_frontend(ident, frame)

    def send_stop(self, inst: Instance) -> None:
        self.to_worker(inst.identity, S.Stop())

    def to_worker(self, ident: bytes, msg: Any) -> None:
        self.sockets.to_worker(ident, S.encode(msg))

    def to_frontends(self, msg: Any) -> None:
        frame = S.encode(msg)
        for ident in self.frontends:
            self.sockets.to_frontend(ident, frame)

    def to_workers(self, msg: Any) -> None:
        frame = S.encode(msg)
        for ident in self.instances.worker_identities():
            self.sockets.to_worker(ident, frame)

    def server_pids(self) -> set[int]:
        """The server's own processes: supervisor, this broker, the frontends, the warm templates
        and their spares."""
        return {self.opts.supervisor_pid, os.getpid(), *(pid for _, pid in self.peers.values()),
                *self.pool.unlisted()}

    def announce_gone(self, prefix: str) -> None:
        """Frontends and workers that mapped a dead worker's segments let go of them, so the
        memory is freed rather than held by their mappings."""
        self.to_frontends(S.Gone(prefix))
        self.to_workers(S.Gone(prefix))
        self.cache.drop_mappings(prefix)

    def unmap(self, keys: list[str]) -> None:
        """Every worker drops its mappings of client regions nobody uses any more."""
        self.to_workers(S.Unmap(keys))

    def route_release(self, msg: S.Release) -> None:
        if msg.owner == CACHE_OWNER:
            self.cache.release(msg.leases)
            return
        if self.ensembles.release_handover(msg):
            return
        if self.instances.is_worker(msg.owner):
            self.sockets.to_worker(msg.owner, S.encode(msg))
        elif self.links is not None:
            self.links.release(msg)     # outputs of another broker's worker (a BLS reply)

    def publish_table(self) -> None:
        self.ensembles.settle()
        self.cache.mark()
        table = self.registry.publish(self.drain.stopping, self.boot)
        if self.secondaries is None:
            self.to_frontends(table)
            return
        frame, merged = S.encode(table), S.encode(self.secondaries.merged(table))
        for ident in self.frontends:
            self.sockets.to_frontend(ident, merged if ident in self.supervisors else frame)

    def table_for(self, ident: bytes) -> S.Table:
        """The model table a peer gets: the supervisor of several brokers sees all of them."""
        table = self.registry.table(self.drain.stopping, self.boot)
        if self.secondaries is not None and ident in self.supervisors:
            return self.secondaries.merged(table)
        return table

    def observed(self) -> S.Observe:
        return S.Observe(self.settings.log_config, self.tracer.gates())

    def observe_changed(self) -> None:
        """Log or trace settings changed: every process applies them now."""
        self.tracer.reload()
        msg = self.observed()
        logs.apply(msg.log)
        self.to_frontends(msg)
        self.to_workers(msg)

    def publish_if_changed(self) -> None:
        if self.registry.dirty and (not self.publish_gap_s or self.clock.now() >= self.next_publish):
            self.next_publish = self.clock.now() + self.publish_gap_s
            self.publish_table()

    # ------------------------------------------------------------------ frontends

    def on_frontend_frame(self, ident: bytes, frame: bytes) -> None:
        try:
            msg = self.fe_decoder.decode(frame)
        except S.DecodeError:
            log.warning("dropped an undecodable frame from a frontend")
            return
        if isinstance(msg, S.Hello):
            self.on_hello(ident, msg)
            return
        reply = self.frontends.get(ident)
        if reply is None:                   # a frontend that outlived our predecessor
            reply = self.frontends[ident] = functools.partial(self.reply_frontend, ident)
            self.sockets.to_frontend(ident, S.encode(self.table_for(ident)))
            self.sockets.to_frontend(ident, S.encode(self.observed()))
        if isinstance(msg, S.Infer):
            # another broker's is a model's BLS call, served while the server drains
            self.on_infer(reply, msg, None, ident, bool(self.broker_peers) and ident in self.broker_peers)
        elif isinstance(msg, S.Release):
            self.frontend_leases.released(ident, msg)
            self.route_release(msg)
        elif isinstance(msg, S.TraceDone):
            self.tracer.done(msg)
        elif isinstance(msg, S.Control):
            self.controller.handle(msg.op, functools.partial(self.answer_control, ident, msg.cid))
        elif isinstance(msg, S.Cancel):
            self.on_cancel(ident, msg.rid)
        elif isinstance(msg, S.Credit):
            handle = self.live.get(ident, msg.rid)
            if isinstance(handle, Req):
                self.streams.credit(handle, msg.n)

    def on_hello(self, ident: bytes, msg: S.Hello) -> None:
        if msg.proto != S.PROTOCOL_VERSION:
            log.error("refused a %s process (pid %d) that speaks protocol version %d, not %d",
                      msg.kind, msg.pid, msg.proto, S.PROTOCOL_VERSION)
            self.frontends.pop(ident, None)
            self.sockets.to_frontend(ident, S.encode(S.Refused(
                f"the broker speaks protocol version {S.PROTOCOL_VERSION}, this process {msg.proto}")))
            return
        self.frontends[ident] = functools.partial(self.reply_frontend, ident)
        self.peers[ident] = (msg.kind, msg.pid)
        if msg.kind == "broker":
            self.broker_peers.add(ident)
        elif msg.kind == "supervisor":
            self.supervisors.add(ident)
        if msg.kind != "supervisor":      # frontends and the other brokers (their BLS calls)
            self.frontend_leases.hello(ident, msg.pid)
        self.sockets.to_frontend(ident, S.encode(self.table_for(ident)))
        self.sockets.to_frontend(ident, S.encode(self.observed()))

    def on_frontend_exit(self, pidfd: int) -> None:
        """A frontend process died: the worker blocks its replies still pointed at are freed."""
        ident, releases = self.frontend_leases.exited(pidfd)
        self.frontends.pop(ident, None)
        for release in releases:
            self.route_release(release)

    def answer_control(self, ident: bytes, cid: int, result: ControlResult = None,
                       error: TritonError | None = None) -> None:
        self.sockets.to_frontend(ident, S.encode(S.ControlReply(cid, result, error)))

    def answer_worker(self, ident: bytes, cid: int, result: ControlResult = None,
                      error: TritonError | None = None) -> None:
        if self.instances.get(ident) is not None:       # the caller may have died meanwhile
            self.sockets.to_worker(ident, S.encode(S.ControlReply(cid, result, error)))

    def on_infer(self, reply: ReplyTo, msg: S.Infer, caller: bytes | None = None, requester: bytes = b"",
                 forwarded: bool = False) -> None:
        """A request from a frontend (`requester`), or (`caller`: a worker's identity) a model's
        BLS call, which is served even while the server drains: its caller is a request in
        flight. Either may cancel it while it is owed a reply. `forwarded`: a BLS call another
        broker passed on (requester: that broker)."""
        try:
            if caller is None and not forwarded and self.drain.stopping:
                raise unavailable(SHUTTING_DOWN)
            untrusted(msg, self.own_prefix)
            if caller is not None and self.links is not None and not self.registry.get(msg.model):
                elsewhere = self.links.owner(msg.model)
                if elsewhere is not None:       # another broker schedules it
                    msg.cache_key, msg.trace = b"", None
                    self.links.forward(elsewhere, caller, msg)
                    return
            mv = self.registry.resolve(msg.model, msg.version, restarting_ok=True)
        except TritonError as e:
            reply(S.InferReply(msg.rid, error=e))
            return
        trace = None
        if caller is not None:
            msg.cache_key, msg.trace = b"", None      # a model's code may not name cache entries
            reply = self.bls.admit(caller, msg, mv)
            if reply is None:
                return
            requester = caller
            if msg.parent_trace:
                trace, reply = self.tracer.bls_child(reply, msg, mv)
        else:
            if msg.trace is not None:
                trace, reply = self.tracer.start(reply, msg, mv)
            if msg.cache_key and self.cache.enabled:
                reply = self.cache.lookup(reply, msg, mv)
                if reply is None:
                    return      # answered from the response cache
        route = self.live.route(requester, msg.rid, reply)
        handle = self.ensembles.submit(route, msg, mv, trace)
        self.live.track(route, handle)

    def on_cancel(self, requester: bytes, rid: int) -> None:
        handle = self.live.get(requester, rid)
        if handle is None:
            if self.links is not None:
                self.links.cancel(requester, rid)       # a BLS call another broker serves
            return                  # answered already
        if isinstance(handle, Req):
            self.requests.cancel(handle)
        else:
            handle.cancel(TritonError(Code.CANCELLED, REQUEST_CANCELLED))

    # ------------------------------------------------------------------ workers

    def on_worker_frame(self, ident: bytes, frame: bytes) -> None:
        inst = self.instances.get(ident)
        if inst is None:
            return  # a dead incarnation's late frame
        try:
            msg = self.wk_decoder.decode(frame)
        except S.DecodeError:
            log.warning("dropped an undecodable frame from worker %s", inst.name)
            return
        inst.last_heartbeat = self.clock.now()
        mv = self.instances.model_of(inst)
        if isinstance(msg, S.BatchDone):
            self.requests.on_batch_done(inst, mv, msg)
        elif isinstance(msg, S.WorkerUp):
            self.lifecycle.on_worker_up(mv, inst, msg)
            self.sockets.to_worker(ident, S.encode(self.observed()))
        elif isinstance(msg, S.WorkerDown):
            self.supervision.on_load_failed(mv, inst, msg.reason)
        elif isinstance(msg, S.Respond):
            self.streams.on_respond(inst, msg, self.requests.finish)
        elif isinstance(msg, S.Infer):
            self.on_infer(functools.partial(self.to_worker, ident), msg, caller=ident)
        elif isinstance(msg, S.Release):
            self.route_release(msg)
        elif isinstance(msg, S.Cancel):
            self.on_cancel(ident, msg.rid)
        elif isinstance(msg, S.ReadyResult):
            self.readiness.on_result(inst, msg)
        elif isinstance(msg, S.Control):
            self.on_model_control(inst, ident, msg)

    def on_model_control(self, inst: Instance, ident: bytes, msg: S.Control) -> None:
        """What a model asks of the server itself: pb_utils.load_model and kin, and its own metrics."""
        if isinstance(msg.op, MODEL_CONTROL):
            self.control.handle(msg.op, functools.partial(self.answer_worker, ident, msg.cid))
        elif isinstance(msg.op, METRIC_OPS):
            try:
                result, error = self.custom_metrics.handle(inst.identity, msg.op), None
            except TritonError as e:
                result, error = None, e
            if msg.cid:         # a dropped reference is not answered
                self.answer_worker(ident, msg.cid, result, error)
        else:
            self.answer_worker(ident, msg.cid, error=invalid(f"a model may not ask '{type(msg.op).__name__}'"))

    def on_worker_exit(self, inst: Instance) -> None:
        self.custom_metrics.owner_gone(inst.identity)
        self.readiness.on_exit(inst)
        self.supervision.on_exit(inst, self.clock.now())

    # ------------------------------------------------------------------ drain and stop

    def begin_drain(self, then_stop: bool = False) -> None:
        if self.drain.begin(self.clock.now(), then_stop):
            self.registry.dirty = True

    def stop(self) -> None:
        self.running = False
        self.supervision.shutting_down = True

    def fail(self) -> None:
        """Stop with a non-zero exit: the broker cannot serve (its repository is unreadable)."""
        self.exit_code = 1
        self.stop()

    # ------------------------------------------------------------------ timers

    def timers(self) -> float:
        """Fire due timers; return seconds until the next one."""
        now = self.clock.now()
        now_ns = self.clock.now_ns()
        alarm = self.requests.alarm
        if now_ns >= alarm.at_ns:
            alarm.at_ns = now_ns + TIMER_WALK_NS
            self.walk_timers(now_ns)
        next_s = max(0.0, (alarm.at_ns - now_ns) / 1e9)
        idle_at = self.requests.reap(now_ns, self.registry.versions())
        if idle_at:
            next_s = min(next_s, max(0.0, (idle_at - now_ns) / 1e9))
        if 0.0 < next_s < 0.001:
            self.sockets.wait_briefly(next_s)
            next_s = 0.0
        if now >= self.next_check:
            self.supervision.check(now, judge_silence=not self.sockets.worker_pending())
            self.next_check = min(now + CHECK_INTERVAL_S, self.supervision.next_restart())
        if now >= self.next_ping:
            self.next_ping = now + PING_INTERVAL_S
            self.to_frontends(S.Ping(self.boot))
        if self.links is not None:
            next_s = min(next_s, self.links.tick(now))
            if self.secondaries is not None:
                next_s = min(next_s, self.secondaries.tick(now))
        self.model_ops.tick(now)
        self.tracer.tick(now_ns)
        if self.readiness.asks:
            next_s = min(next_s, self.readiness.tick(now))
        if self.publish_gap_s and self.registry.dirty:      # a table held back goes out by then
            next_s = min(next_s, max(0.0, self.next_publish - now))
        if self.drain.stopping:     # what a drain looks at costs nothing while none runs
            idle = not self.inflight and not self.streams.open and self.registry.idle()
            cancel, stop = self.drain.tick(now, idle, os.getppid() == self.opts.supervisor_pid)
            if cancel:
                self.requests.cancel_all(list(self.registry.all_versions()),
                                         unavailable("Server is shutting down: the exit timeout expired"))
            if stop:
                self.stop()
        return min(next_s, self.next_check - now, self.next_ping - now)

    def walk_timers(self, now_ns: int) -> None:
        """Every model's timers: queue timeouts, restarts waited on too long, batches whose
        queue delay ended; each time still ahead sets the alarm."""
        alarm = self.requests.alarm
        for mv in self.registry.all_versions():
            sched = mv.scheduler
            if sched is None or not len(sched):
                continue
            sched.expire(mv, now_ns)
            self.supervision.expire_restart_wait(mv)
            if mv.wake_ns and mv.wake_ns <= now_ns:
                mv.wake_ns = 0
                sched.dispatch(mv)
            deadline = sched.next_deadline()
            if deadline:
                alarm.set(deadline)
            if mv.wake_ns:
                alarm.set(mv.wake_ns)

    # ------------------------------------------------------------------ loop

    def on_signals(self, numbers: bytes) -> None:
        """Signals the wakeup fd carried: SIGTERM drains, then stops; SIGHUP rescans the
        repository (poll mode)."""
        if signal.SIGHUP in numbers:
            self.model_ops.hangup()
        if signal.SIGTERM in numbers:
            self.begin_drain(then_stop=True)
        if self.secondaries is not None:
            for sig in (signal.SIGHUP, signal.SIGTERM):
                if sig in numbers:
                    self.secondaries.signal(sig)

    def run(self, signal_fd: int) -> int:
        """Serve until stopped; `signal_fd` carries the numbers of the signals received.
        Needs the real sockets (BrokerSockets)."""
        sockets = self.sockets
        assert isinstance(sockets, BrokerSockets)
        # The fds that rarely fire (signals, load jobs, process exits) sit in one epoll set,
        # so each turn's poll looks at three items however many processes are watched.
        slow = select.epoll()
        slow.register(signal_fd, select.EPOLLIN)
        slow.register(self.jobs.fd, select.EPOLLIN)
        poller = zmq.Poller()
        poller.register(sockets.fe, zmq.POLLIN)
        poller.register(sockets.wk, zmq.POLLIN)
        poller.register(slow.fileno(), zmq.POLLIN)
        links = self.start_links(sockets)
        for sock in links:
            poller.register(sock, zmq.POLLIN)
        self.model_ops.startup()
        registered: set[int] = set()
        try:
            while self.running:
                timeout = self.timers()
                if self.instances.fds_changed or self.frontend_leases.fds_changed or self.secondaries_changed():
                    self.instances.fds_changed = self.frontend_leases.fds_changed = False
                    registered = self.watch_exits(slow, registered)
                if self.registry.dirty:
                    self.publish_if_changed()
                wake = self.end_turn()
                if wake:    # a batch waits for its queue delay: the poll ends by then
                    timeout = min(timeout, max(0.0, (wake - self.clock.now_ns()) / 1e9))
                    if 0.0 < timeout < 0.001:   # below the poller's resolution: no turn spent on it
                        sockets.wait_briefly(timeout)
                        timeout = 0.0
                events = dict(poller.poll(max(0, int(timeout * 1000))))
                if sockets.wk in events:
                    sockets.drain(sockets.wk, self.on_worker_frame)
                if sockets.fe in events:
                    sockets.drain(sockets.fe, self.on_frontend_frame)
                if events.get(slow.fileno()):
                    self.on_slow_fds([fd for fd, _ in slow.poll(0)], signal_fd, slow, registered)
                for sock in links:
                    if sock in events:
                        self.links.receive(sock)
                if self.registry.dirty:
                    self.publish_if_changed()
        finally:
            slow.close()
        self.end_turn()
        self.jobs.close()
        if self.secondaries is not None:
            self.secondaries.stop()
        if self.links is not None:
            self.links.close()
        self.shutdown_workers()
        self.tracer.close()
        self.cache.close()
        self.frontend_leases.close()
        return self.exit_code

    def start_links(self, sockets: BrokerSockets) -> list[zmq.Socket]:
        """With --broker-shards: links to the other brokers, which the first one starts;
        returns the links' sockets."""
        if self.opts.broker_shards == 1:
            return []
        self.links = PeerLinks(self.opts, sockets.ctx, self.clock.now, self.to_worker, self.instances.is_worker,
                               self.mark_dirty if self.opts.shard == 0 else lambda: None)
        if self.opts.shard == 0:
            self.secondaries = Secondaries(self.opts, self.links, self.clock.now, self.fail, self.pool.others)
            self.controller = Fanout(self.links, self.secondaries, self.jobs, self.control.handle,
                                     lambda: self.registry.names, self.opts)
            self.secondaries.start()
        return self.links.sockets()

    def secondaries_changed(self) -> bool:
        if self.secondaries is None or not self.secondaries.fds_changed:
            return False
        self.secondaries.fds_changed = False
        return True

    def mark_dirty(self) -> None:
        self.registry.dirty = True

    def watch_exits(self, slow: select.epoll, registered: set[int]) -> set[int]:
        """Watch the pidfds of the processes alive now. A closed pidfd left epoll by itself and
        its number may be a new process's now, so the whole set is registered again."""
        fds = self.instances.pidfds() | self.frontend_leases.pidfds()
        if self.secondaries is not None:
            fds |= self.secondaries.pidfds()
        for fd in registered:
            with contextlib.suppress(OSError):
                slow.unregister(fd)
        for fd in fds:
            slow.register(fd, select.EPOLLIN)
        return fds

    def on_slow_fds(self, fds: list[int], signal_fd: int, slow: select.epoll, registered: set[int]) -> None:
        """Signals, finished load jobs and exited processes: a pidfd fires once, so it leaves
        the watched set as its exit is handled."""
        if signal_fd in fds:
            self.on_signals(os.read(signal_fd, 64))
        if self.jobs.fd in fds:
            self.jobs.collect()
        for fd in fds:
            if fd in (signal_fd, self.jobs.fd):
                continue
            with contextlib.suppress(OSError):
                slow.unregister(fd)
            registered.discard(fd)
            inst = self.instances.by_pidfd(fd)
            if inst is not None:
                self.on_worker_exit(inst)
            elif fd in self.frontend_leases.pidfds():
                self.on_frontend_exit(fd)
            elif self.secondaries is not None:
                self.secondaries.on_exit(fd)

    def shutdown_workers(self) -> None:
        """Stop every worker: a busy one is killed at once (its requests were answered when
        the drain ended), an idle one is asked to stop and killed if it does not within
        5 s; then every worker segment is reclaimed."""
        live = [i for i in self.instances.spawned() if self.pool.alive(i)]
        for inst in live:
            if inst.state in (InstanceState.BUSY, InstanceState.KILLED):
                self.pool.kill(inst)
            else:
                self.send_stop(inst)
            inst.move_to(InstanceState.STOPPING)
        deadline = self.clock.now() + STOP_WAIT_S
        for inst in live:
            if not self.pool.wait(inst, deadline - self.clock.now()):
                self.pool.kill(inst)
                self.pool.wait(inst, STOP_WAIT_S)
        if self.opts.shard:     # another broker's workers may still run: only this one's
            for inst in live:
                sweep(owner_prefix(self.server_id, inst.owner))
        else:
            sweep(f"{PREFIX}{self.server_id}.w")

