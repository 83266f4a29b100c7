"""Business-logic scripting: a Python model calling another model through the broker.

The calling worker sends an ordinary Infer to the broker on its own socket and blocks for
the reply while other workers serve the callee. Several calls may be in flight at once
(`async_exec` runs each in an executor thread): the ZeroMQ socket is not thread-safe, so
whichever waiting thread holds the reader role does all socket I/O (sending what the others
queued, receiving every reply) and hands the socket over once its own reply arrived.
What the reader receives for the worker's own loop (an Exec, a Stop) waits in `inbox`. A
decoupled Python model's threads and coroutines call on after execute() returned, while the
loop waits for its next Exec: that loop then reads through the reader role too
(`next_message`), never beside it.
The broker refuses a call that could never be answered (the callee's instances all wait,
directly or through other calls, on this caller), so a call never waits on itself.
A call with `exec(decoupled=True)` yields the callee's replies as they arrive; an iterator the
model abandons cancels the call and lets the rest of its replies go.
What else a model asks of the server travels the same way, as control operations the broker
answers: its own model control (pb_utils.load_model and kin) and its custom metrics.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import zmq

from tritond.repository.datatypes import array_to_bytes
from tritond.repository.layout import validate_model_name
from tritond.repository.overrides import write_overrides
from tritond.shm.arena import Arena
from tritond.shm.mapping import SegmentMaps
from tritond.wire import schema as P
from tritond.wire.errors import TritonError, invalid

from .tensors import desc_to_array

log = logging.getLogger("tritond.worker")

# A call's answer: outputs, or the error; the response's parameters.
Answer = tuple[dict[str, tuple[np.ndarray, str]], TritonError | None, dict]   # outputs: (array, datatype)


class Caller(Protocol):
    """What a BLS call uses of its worker (workers/main.py)."""
    spec: P.WorkerSpec
    sock: zmq.Socket
    arena: Arena
    maps: SegmentMaps
    decoder: Any
    stop_requested: bool

    def handle_side(self, msg: Any) -> bool: ...


class BlsClient:
    def __init__(self, worker: Caller) -> None:
        self.w = worker
        self.cond = threading.Condition()
        self.rids = itertools.count(1)
        self.outbox: list[bytes] = []
        self.replies: dict[int, P.InferReply] = {}
        self.streams: dict[int, deque[P.InferReply]] = {}    # decoupled calls being iterated
        self.abandoned: dict[int, list] = {}    # decoupled calls nobody iterates -> their input blocks
        self.controls: dict[int, P.ControlReply] = {}   # answers to the model's own model control
        self.inbox: deque[Any] = deque()        # the worker loop's messages a reader received
        self.reading = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def stray(self, msg: Any) -> None:
        """A message the worker's main loop received but does not handle itself."""
        if isinstance(msg, P.InferReply):
            self._arrived(msg)
        elif isinstance(msg, P.ControlReply):
            self._answered(msg)

    def _answered(self, msg: P.ControlReply) -> None:
        with self.cond:
            self.controls[msg.cid] = msg
            self.cond.notify_all()

    # ---------------------------------------------------------------- the model's own model control

    def load_model(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        """pb_utils.load_model: a client's explicit load, `file:` overrides written as a frontend writes them."""
        op = P.LoadModel(name, config or None)
        if files and self.w.spec.override_run_dir:      # else the broker refuses the load (not explicit mode)
            if not config:
                raise invalid("Load parameter 'config' must be specified for model file override")
            bad = validate_model_name(name)
            if bad:
                raise invalid(bad)
            op.override_dir = write_overrides(self.w.spec.override_run_dir, name, files,
                                              self.w.spec.override_max_bytes)
        self._control(op)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._control(P.UnloadModel(name, unload_dependents))

    def is_model_ready(self, name: str, version: int) -> bool:
        return self._control(P.ModelReady(name, version)).ready

    def metric_call(self, op: Any) -> Any:
        """A pb_utils.MetricFamily or Metric operation, answered by the broker that holds them."""
        return self._control(op)

    def metric_drop(self, family: int = 0, metric: int = 0) -> None:
        """A family's or metric's object was deleted: let the broker know, without waiting."""
        self.send(P.encode(P.Control(0, P.MetricDrop(family, metric))))

    def _control(self, op: Any) -> Any:
        """The broker's answer to one control operation (raises its error)."""
        with self.cond:
            cid = next(self.rids)
        self._wait(P.encode(P.Control(cid, op)), lambda: cid in self.controls)
        with self.cond:
            reply = self.controls.pop(cid)
        if reply.error is not None:
            raise reply.error
        return reply.result

    def _arrived(self, msg: P.InferReply) -> None:
        with self.cond:
            if msg.rid in self.streams:
                self.streams[msg.rid].append(msg)
            elif msg.rid in self.abandoned:
                if not msg.more:      # the callee is done with the inputs too
                    self._free(self.abandoned.pop(msg.rid))
                self._release(msg)
            else:
                self.replies[msg.rid] = msg
            self.cond.notify_all()

    def _request(self, model_name: str, model_version: int, inputs: dict[str, tuple[np.ndarray, str]],
                 requested_output_names: list[str], request_id: str, parameters: dict,
                 correlation_id: Any, flags: int, timeout_us: int, trace_id: int = 0) -> tuple[int, bytes, list]:
        """(rid, the Infer frame, arena blocks holding its inputs until the call is over)."""
        blocks: list = []
        descs = []
        try:
            inline = [0]
            for name, (arr, datatype) in inputs.items():
                descs.append(self._place(name, np.asarray(arr), datatype, blocks, inline))
        except BaseException:
            self._free(blocks)
            raise
        with self.cond:
            rid = next(self.rids)
        frame = P.encode(P.Infer(
            rid, model_name, int(model_version), descs, [P.OutputSpec(n) for n in requested_output_names],
            request_id, dict(parameters or {}), 0, int(timeout_us or 0), correlation_id or 0, int(flags or 0),
            parent_trace=trace_id))
        return rid, frame, blocks

    def _free(self, blocks: list) -> None:
        for block in blocks:
            self.w.arena.free(block.seg, block.offset)

    def infer(self, *args: Any) -> Answer:
        """pb_utils' BLS handler: run one request (arguments as pb_utils.set_bls_handler says);
        (outputs, None, parameters) or ({}, error, {})."""
        rid, frame, blocks = self._request(*args)
        try:
            reply = self._call(rid, frame)
        except BaseException:
            self._free(blocks)
            raise
        if reply.more:      # a decoupled callee: the first response is the answer, the rest is let go
            with self.cond:
                self.abandoned[rid] = blocks
                late = self.replies.pop(rid, None)      # one more came in meanwhile
            if late is not None:
                self._arrived(late)
            self.send(P.encode(P.Cancel(rid)))
        else:
            self._free(blocks)
        return self._outputs(reply)

    def infer_stream(self, *args: Any) -> tuple[Iterator[Answer], Callable[[], None]]:
        """pb_utils' decoupled BLS handler: the call's replies as an iterator of (outputs, error,
        parameters), and a function that cancels the call."""
        rid, frame, blocks = self._request(*args)
        with self.cond:
            self.streams[rid] = deque()

        def cancel() -> None:
            self.send(P.encode(P.Cancel(rid)))

        def replies() -> Iterator[Answer]:
            finished = False
            try:
                queue = self.streams[rid]
                self._wait(frame, lambda: bool(queue))
                while True:
                    with self.cond:
                        reply = queue.popleft() if queue else None
                    if reply is None:
                        self._wait(None, lambda: bool(queue))
                        continue
                    finished = not reply.more
                    yield self._outputs(reply)
                    if finished:
                        return
            finally:
                with self.cond:
                    left = self.streams.pop(rid, deque())
                    running = not finished and not any(not r.more for r in left)
                    if running:
                        self.abandoned[rid] = blocks
                for r in left:
                    self._release(r)
                if not finished:
                    cancel()
                if not running:
                    self._free(blocks)
        return replies(), cancel

    def _outputs(self, reply: P.InferReply) -> Answer:
        """The reply's outputs copied out of the callee's memory, which is then released."""
        if reply.error is not None:
            return {}, reply.error, {}
        try:
            return ({d.name: (np.array(desc_to_array(d, self.w.maps), copy=True), d.datatype) for d in reply.outputs},
                    None, reply.parameters)
        finally:
            self._release(reply)

    def _release(self, reply: P.InferReply) -> None:
        leases = sorted({P.lease_of(d) for d in reply.outputs} - {0})
        if leases:
            self.send(P.encode(P.Release(reply.owner, leases)))

    def _place(self, name: str, arr: np.ndarray, datatype: str, blocks: list, inline: list[int]) -> P.TensorDesc:
        """Inline when small (within the message's inline budget, counted in inline[0]), else one
        copy into this worker's arena (freed after the reply)."""
        payload = array_to_bytes(arr, datatype)
        size = len(payload) if isinstance(payload, bytes) else payload.nbytes
        if size <= P.INLINE_MAX and inline[0] + size <= P.INLINE_BUDGET:
            inline[0] += size
            return P.TensorDesc(name, datatype, list(arr.shape), P.Inline(bytes(payload)))
        block = self.w.arena.alloc(size)
        blocks.append(block)
        block.view[:size] = payload
        return P.TensorDesc(name, datatype, list(arr.shape), P.Block(block.seg, block.offset, size))

    # ---------------------------------------------------------------- socket I/O

    def next_message(self) -> Any:
        """The worker loop's next message, read in the reader role (waiting while a call has it)."""
        self._wait(None, lambda: bool(self.inbox))
        with self.cond:
            return self.inbox.popleft()

    def send(self, frame: bytes) -> None:
        """Send from any thread: now, or by the reader when another thread has the socket."""
        with self.cond:
            if not self.reading:
                self.w.sock.send(frame)
                return
            self.outbox.append(frame)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"\0")
        except BlockingIOError:
            pass            # the pipe is full: the reader is already due to wake

    def _call(self, rid: int, frame: bytes) -> P.InferReply:
        self._wait(frame, lambda: rid in self.replies)
        with self.cond:
            return self.replies.pop(rid)

    def _wait(self, frame: bytes | None, ready: Callable[[], bool]) -> None:
        """Send `frame` (if any), then wait until `ready()` (checked under the lock), taking the
        reader role while no other thread has it."""
        with self.cond:
            if frame is not None:
                self.outbox.append(frame)
                if self.reading:
                    self._wake()
            while not ready():
                if self.reading:
                    self.cond.wait()
                    continue
                self.reading = True
                self.cond.release()
                try:
                    self._read_until(ready)
                finally:
                    self.cond.acquire()
                    self.reading = False
                    self.cond.notify_all()

    def _read_until(self, ready: Callable[[], bool]) -> None:
        """The reader role: send what is queued, receive until `ready()`."""
        w = self.w
        poller = zmq.Poller()
        poller.register(w.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        while True:
            with self.cond:
                frames, self.outbox = self.outbox, []
                if ready():
                    break
            for frame in frames:
                w.sock.send(frame)
            events = dict(poller.poll())
            if self.wake_r in events:
                try:
                    os.read(self.wake_r, 4096)
                except BlockingIOError:
                    pass
            while True:
                try:
                    msg = w.decoder.decode(w.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(msg, P.InferReply):
                    self._arrived(msg)
                elif isinstance(msg, P.ControlReply):
                    self._answered(msg)
                elif not w.handle_side(msg):
                    if isinstance(msg, P.Stop):
                        w.stop_requested = True
                    with self.cond:
                        self.inbox.append(msg)
                        self.cond.notify_all()
        for frame in frames:
            w.sock.send(frame)
