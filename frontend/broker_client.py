"""The frontend's connection to the broker (asyncio over a ZeroMQ DEALER).

It keeps the latest model table the broker published, matches replies to waiting futures,
and notices a silent broker: pending requests then fail with UNAVAILABLE and the client
keeps saying hello until a (restarted) broker answers.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from typing import Any, Callable

import zmq

from tritond import logs
from tritond.process import EXIT_REFUSED
from tritond.wire import schema as S
from tritond.wire.errors import TritonError, invalid, unavailable
from tritond.wire.versions import resolve

log = logging.getLogger("tritond.frontend")

BROKER_SILENCE_S = 3.0
NOBLOCK = int(zmq.NOBLOCK)      # int flags: pyzmq's enum operations cost more than the send
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)


class ModelTable:
    """Index over the broker's published table for lookups on every request."""

    def __init__(self, table: S.Table | None = None) -> None:
        self.table = table
        self.by_name: dict[str, dict[int, S.ModelEntry]] = {}
        self.names: set[str] = set()
        if table is not None:
            for e in table.models:
                self.by_name.setdefault(e.name, {})[e.version] = e
            self.names = set(table.names)

    def resolve(self, name: str, version: int = -1, restarting_ok: bool = False) -> S.ModelEntry:
        """The entry serving (name, version), or Triton's error for it; `restarting_ok` for
        an inference, which queues in the broker while the model's instances restart."""
        if self.table is None:
            raise unavailable("the server's broker is not available")
        return resolve(name, version, self.by_name.get(name), name in self.names, restarting_ok)

    def any_entry(self, name: str, version: int = -1) -> S.ModelEntry:
        """An entry for metadata/config even when not READY (Triton still answers config)."""
        try:
            return self.resolve(name, version)
        except TritonError:
            versions = self.by_name.get(name)
            if versions and version < 0:
                with_config = [e for e in versions.values() if e.config]
                if with_config:
                    return max(with_config, key=lambda e: e.version)
            raise

    def ready(self, strict: bool, paged: bool = False) -> bool:
        """`paged` (--model-control-mode=paged): a model paging in or out (`restarting`) is
        not one that failed, so it does not make the server unready."""
        t = self.table
        if t is None or not t.startup_done or t.stopping:
            return False
        if not strict:
            return True
        for versions in self.by_name.values():
            for e in versions.values():
                if e.state is not S.ModelState.READY and not e.unloaded and not (paged and e.restarting):
                    return False
        return True


class ReplyStream:
    """The replies of one request as the broker passes them on (a decoupled model's responses).

    The consumer takes them with `next()` and calls `written()` once it wrote one out; every
    quarter window of written replies becomes a Credit, so the model never runs more than the
    window ahead of the client. `cancel()` gives up on the request."""

    def __init__(self, client: "BrokerClient", rid: int, window: int) -> None:
        self.client = client
        self.rid = rid
        self.window = window
        self.credit_every = max(1, window // 4)     # replies taken before a Credit goes back
        self.replies: deque[S.InferReply] = deque()
        self.event = asyncio.Event()
        self.error: TritonError | None = None
        self.finished = False
        self.unacked = 0

    def put(self, reply: S.InferReply) -> None:
        self.replies.append(reply)
        self.event.set()

    def fail(self, err: TritonError) -> None:
        self.error = err
        self.event.set()

    async def next(self) -> S.InferReply:
        while not self.replies:
            if self.error is not None:
                raise self.error
            self.event.clear()
            await self.event.wait()
        reply = self.replies.popleft()
        if not reply.more:
            self.finished = True
        return reply

    def written(self) -> None:
        self.unacked += 1
        if self.window and self.unacked >= self.credit_every and not self.finished:
            self.client._send_quietly(S.encode(S.Credit(self.rid, self.unacked)))
            self.unacked = 0

    def cancel(self, on_orphan: Callable[[], None] | None = None) -> None:
        """Give up: the broker takes the request out (or flags it to the model); replies still
        on their way are released when they come, and `on_orphan` runs after the last one."""
        client = self.client
        client.streams.pop(self.rid, None)
        for reply in self.replies:
            client.release_outputs(reply)
            self.finished = self.finished or not reply.more
        self.replies.clear()
        if self.finished or self.error is not None:
            if on_orphan is not None:
                on_orphan()
            return
        client._send_quietly(S.encode(S.Cancel(self.rid)))
        if on_orphan is not None:
            client.orphans[self.rid] = on_orphan


class BrokerClient:
    def __init__(self, endpoint: str, kind: str) -> None:
        self.endpoint = endpoint
        self.kind = kind
        self.ctx = zmq.Context()
        self.sock: zmq.Socket | None = None
        self.futures: dict[int, asyncio.Future] = {}
        self.streams: dict[int, ReplyStream] = {}
        self.orphans: dict[int, Callable[[], None]] = {}
        self.cancelled_traces: dict[int, Callable[[S.InferReply], None]] = {}
        self.ids = itertools.count(1)
        self.table = ModelTable()
        self.table_event = asyncio.Event()
        self.last_heard = 0.0
        self.alive = False
        self.serving = True       # every frontend process of the server is serving (see readiness.py)
        self.boot = 0
        self.on_gone: Callable[[str], None] | None = None   # drops mappings of a dead owner's segments
        self.decoder = S.decoder(S.BrokerToFrontend)
        self.tasks: list[asyncio.Task] = []
        self.tracing: dict[str, str] = {}      # model ("" = the rest) -> trace mode to stamp for
        self.on_table: Callable[[], None] | None = None     # a new table arrived (frontend/brokers.py)
        self.outbox: list[bytes] = []       # frames queued this loop turn (see _send)
        self.outbox_rids: list[int] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def _connect(self) -> None:
        """One DEALER for the frontend's life: ZeroMQ reconnects it to a restarted broker."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.MAXMSGSIZE, S.MAX_FRAME)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.connect(self.endpoint)
        self.sock = s
        self.loop = asyncio.get_running_loop()

    async def start(self) -> None:
        self._connect()
        self.loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)
        self.tasks = [asyncio.create_task(self._watchdog())]
        await self._hello()

    def _send(self, frame: bytes, rid: int = 0) -> None:
        """Queue a frame for the broker; what one loop turn queues leaves as one message.

        Each ZeroMQ message costs a wake-up of the I/O threads on both sides and a turn of the
        broker's loop, so the requests of every connection served in one turn share them: the
        frames travel as the parts of one multipart message. `rid` names the request or control
        op whose future fails if the message cannot be sent."""
        if len(frame) > S.MAX_FRAME:
            raise invalid(f"request of {len(frame)} bytes is larger than the "
                          f"{S.MAX_FRAME} bytes a request may carry besides its tensors")
        if self.sock is None:
            raise unavailable("the server's broker is not reachable")
        if not self.outbox:
            self.loop.call_soon(self._flush)
        self.outbox.append(frame)
        self.outbox_rids.append(rid)

    def _flush(self) -> None:
        """Send the turn's frames as one message, then read what has arrived: ZeroMQ's FD is
        edge-triggered and a send may consume its readiness."""
        frames, rids = self.outbox, self.outbox_rids
        self.outbox, self.outbox_rids = [], []
        sock = self.sock
        if sock is None:
            return
        try:
            if len(frames) == 1:
                sock.send(frames[0], NOBLOCK)
            else:
                last = len(frames) - 1
                for i, frame in enumerate(frames):
                    sock.send(frame, NOBLOCK_MORE if i < last else NOBLOCK)
        except zmq.ZMQError:
            self._undeliverable(rids)
        self._drain()

    def _undeliverable(self, rids: list[int]) -> None:
        """The broker is not connected: fail what waits on the frames that did not leave."""
        err = unavailable("the server's broker is not reachable")
        for rid in rids:
            fut = self.futures.pop(rid, None) if rid else None
            if fut is not None and not fut.done():
                fut.set_exception(err)
            stream = self.streams.pop(rid, None) if rid else None
            if stream is not None:
                stream.fail(err)

    async def _hello(self) -> None:
        try:
            self._send(S.encode(S.Hello(S.PROTOCOL_VERSION, self.kind, os.getpid())))
        except TritonError:
            pass

    async def wait_table(self, timeout: float) -> bool:
        """Say hello until the broker's model table arrives (a hello sent before the
        connection is up is dropped, so it is repeated every 50 ms)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.table_event.is_set():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.table_event.wait(), min(0.05, remaining))
            except asyncio.TimeoutError:
                await self._hello()
        return True

    def _drain(self) -> None:
        """Read every frame that has arrived (called when the socket's FD turns readable).

        The socket's EVENTS say whether a frame waits, so the loop ends without a raised
        zmq.Again (an exception costs more than the check)."""
        sock = self.sock
        while self._readable():
            try:
                frame = sock.recv(NOBLOCK)
            except zmq.ZMQError:
                return
            try:
                msg = self.decoder.decode(frame)
            except S.DecodeError:
                log.warning("dropped an undecodable frame from the broker")
                continue
            self.last_heard = time.monotonic()
            self.alive = True
            if isinstance(msg, S.InferReply):
                self._reply(msg)
            elif isinstance(msg, S.Replies):
                for reply in msg.replies:
                    self._reply(reply)
            elif isinstance(msg, S.ControlReply):
                fut = self.futures.pop(msg.cid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, S.Table):
                self._note_boot(msg.boot)
                self.table = ModelTable(msg)
                self.table_event.set()
                if self.on_table is not None:
                    self.on_table()
            elif isinstance(msg, S.Ping):
                self._note_boot(msg.boot)
            elif isinstance(msg, S.Gone) and self.on_gone is not None:
                self.on_gone(msg.prefix)
            elif isinstance(msg, S.Observe):
                self.tracing = msg.tracing
                logs.apply(msg.log)
            elif isinstance(msg, S.Refused):
                log.critical("the broker refused this process: %s; exiting to be restarted", msg.reason)
                os._exit(EXIT_REFUSED)

    def _readable(self) -> bool:
        """Whether a frame waits (false on a socket closed or failing: nothing to read)."""
        try:
            return bool(self.sock.get(EVENTS) & POLLIN)
        except zmq.ZMQError:
            return False

    def _reply(self, msg: S.InferReply) -> None:
        """Hand a reply to its stream or its waiting request; one nobody waits for any more (the
        client went away) has its outputs released, and its input blocks freed after the last."""
        stream = self.streams.get(msg.rid)
        if stream is not None:
            if not msg.more:
                del self.streams[msg.rid]
            stream.put(msg)
            return
        fut = self.futures.pop(msg.rid, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)
            return
        self.release_outputs(msg)
        if self.cancelled_traces and not msg.more:
            traced = self.cancelled_traces.pop(msg.rid, None)
            if traced is not None and msg.trace is not None:
                traced(msg)
        orphan = None if msg.more else self.orphans.pop(msg.rid, None)
        if orphan is not None:
            orphan()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self.alive and time.monotonic() - self.last_heard > BROKER_SILENCE_S:
                self._broker_lost("the broker stopped answering")
                self.alive = False
                self.table = ModelTable()
                self.table_event.clear()
            if not self.alive:
                await self._hello()

    def _broker_lost(self, why: str) -> None:
        """Requests the old broker held will never be answered: fail them now."""
        log.error("%s; failing %d pending requests", why, len(self.futures))
        err = unavailable("the server's broker is restarting; retry shortly")
        for fut in self.futures.values():
            if not fut.done():
                fut.set_exception(err)
        self.futures.clear()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.fail(err)
        orphans, self.orphans = self.orphans, {}
        for orphan in orphans.values():
            orphan()
        self.cancelled_traces.clear()

    def _note_boot(self, boot: int) -> None:
        """A new broker: fail what the old one held, and introduce ourselves (it checks our
        protocol version)."""
        if boot and self.boot and boot != self.boot:
            self._broker_lost("the broker was restarted")
            self._send_quietly(S.encode(S.Hello(S.PROTOCOL_VERSION, self.kind, os.getpid())))
        if boot:
            self.boot = boot

    def trace_mode(self, model: str) -> str:
        """The trace mode requests for `model` are stamped for ('' when not traced)."""
        tracing = self.tracing
        if not tracing:
            return ""
        mode = tracing.get(model)
        return tracing.get("", "") if mode is None else mode

    def ready(self, strict: bool, paged: bool = False) -> bool:
        """Server readiness as this frontend reports it."""
        return self.alive and self.serving and self.table.ready(strict, paged)

    def _check(self) -> None:
        if not self.alive:
            raise unavailable("the server's broker is not available")

    async def infer(self, msg: S.Infer, on_orphan: Callable[[], None] | None = None) -> S.InferReply:
        """Send one request and await its reply. If the caller is cancelled first, `on_orphan` runs
        once the broker has answered after all (or is gone), so input blocks are not freed while a
        worker may still read them."""
        self._check()
        fut = self.loop.create_future()
        self.futures[msg.rid] = fut
        try:
            self._send(S.encode(msg), msg.rid)
            return await fut
        except TritonError:
            self.futures.pop(msg.rid, None)
            raise
        except asyncio.CancelledError:
            self.futures.pop(msg.rid, None)
            if fut.done() and not fut.cancelled():
                # Answered (or failed) in the same loop turn as the cancel: settle it now.
                if fut.exception() is None:
                    self.release_outputs(fut.result())
                if on_orphan is not None:
                    on_orphan()
            else:
                # The client went away: the broker takes the request out of its queue (or
                # tells the model), and answers it after all.
                self._send_quietly(S.encode(S.Cancel(msg.rid)))
                if on_orphan is not None:
                    self.orphans[msg.rid] = on_orphan
            raise

    def after_cancel(self, rid: int, traced: Callable[[S.InferReply], None]) -> None:
        """A traced request whose caller was cancelled: `traced` gets the broker's late reply."""
        self.cancelled_traces[rid] = traced

    def open_stream(self, msg: S.Infer) -> ReplyStream:
        """Send a request whose replies come as a stream (msg.window bounds them)."""
        self._check()
        stream = ReplyStream(self, msg.rid, msg.window)
        self.streams[msg.rid] = stream
        try:
            self._send(S.encode(msg), msg.rid)
        except TritonError:
            self.streams.pop(msg.rid, None)
            raise
        return stream

    def next_id(self, model: str = "") -> int:
        return next(self.ids)

    async def control(self, op: S.ControlOp, timeout: float = 600.0) -> Any:
        self._check()
        cid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.futures[cid] = fut
        try:
            self._send(S.encode(S.Control(cid, op)), cid)
            reply = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise unavailable(f"the server's broker did not answer '{type(op).__name__}' in time") from None
        finally:
            self.futures.pop(cid, None)
        if reply.error is not None:
            raise reply.error
        return reply.result

    async def model_ready(self, entry: S.ModelEntry) -> bool:
        """A version the table says is ready is, unless its model's own is_ready() says not."""
        if not entry.ready_hook:
            return True
        return (await self.control(S.ModelReady(entry.name, entry.version))).ready

    def release_outputs(self, reply: S.InferReply) -> None:
        leases = {lease for d in reply.outputs if (lease := S.lease_of(d))}
        if leases and self.sock is not None:
            self._send_quietly(S.encode(S.Release(reply.owner, sorted(leases))))

    def _send_quietly(self, frame: bytes) -> None:
        try:
            self._send(frame)
        except TritonError:
            pass

    def send_quietly(self, msg: S.TraceDone) -> None:
        """A message nobody waits for an answer to (dropped when the broker is away)."""
        if self.sock is not None:
            self._send_quietly(S.encode(msg))

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        if self.outbox:
            self._flush()
        if self.sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.sock.getsockopt(zmq.FD))
            except RuntimeError:
                pass
            self.sock.close(0)
        self.ctx.term()
