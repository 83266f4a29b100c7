"""A worker process: load one model instance, then execute batches until told to stop.

`python -m tritond.workers.main <spec-json>`; spawned by the broker with an argv list.
The main thread computes; a heartbeat thread keeps telling the broker it is alive (and
exits the process if the broker is gone), so a long batch is never mistaken for a hang, and
receives what the broker says about executing requests (cancelled, credit for more streamed
responses). A decoupled model's responses leave on a third socket as they are produced.
A config parameter `memory_limit_bytes` caps what the model may allocate; a MemoryError
anywhere ends the process with EXIT_NO_MEMORY, since its state can no longer be trusted,
and the broker restarts it.
"""
from __future__ import annotations

import gc
import itertools
import logging
import os
import signal
import sys
import threading
import time

import msgspec
import zmq
from setproctitle import setproctitle

from tritond import logs
from tritond.process import EXIT_NO_MEMORY, die_with_parent, limit_memory, setup_logging
from tritond.repository.backends import PYTHON
from tritond.repository.parameters import config_parameter
from tritond.repository.view import model_view
from tritond.shm.arena import Arena
from tritond.shm.heap import WORKER_TRIM_THRESHOLD, keep_large_allocations
from tritond.shm.mapping import MappingError, SegmentMaps
from tritond.shm.regions import CUDA_PREFIX
from tritond.wire import schema as P
from tritond.wire.errors import internal, invalid

from .backends import create
from .backends.base import InstanceInfo, WorkerRequest
from .bls import BlsClient
from .cuda_ipc import Exports, Imports
from .model_errors import ModelError
from .responses import DISCARD, Flow, Responder
from .runs import execute_serially
from .states import SequenceStates, state_specs
from .tensors import Leases, desc_to_array, write_outputs
from .threads import apply_threads
from .warmup import warm_up

log = logging.getLogger("tritond.worker")

HEARTBEAT_INTERVAL_S = 0.5


class StopSignal:
    """Tells the heartbeat thread to end at once: its poll wakes on the pipe, so a stopping
    worker exits without waiting out a heartbeat interval (an unload, a model paged out)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.fd, self._write = os.pipe()

    def set(self) -> None:
        self._event.set()
        os.write(self._write, b"s")

    def is_set(self) -> bool:
        return self._event.is_set()

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write)


def heartbeat(ctx: zmq.Context, spec: P.WorkerSpec, stop: StopSignal, flow: Flow) -> None:
    """Tell the broker this worker lives, every HEARTBEAT_INTERVAL_S, and pass on what it says
    about executing requests."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, P.heartbeat_identity(spec.identity.encode()))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(spec.workers)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(stop.fd, zmq.POLLIN)
    frame = P.encode(P.Heartbeat())
    decoder = P.decoder(P.BrokerToWorker)
    due = time.monotonic() + HEARTBEAT_INTERVAL_S
    while not stop.is_set():
        wait_ms = max(0, int((due - time.monotonic()) * 1000))
        if sock in dict(poller.poll(wait_ms)):
            while True:
                try:
                    msg = decoder.decode(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                except P.DecodeError:
                    continue
                if isinstance(msg, P.CancelKeys):
                    flow.cancel(msg.keys)
                elif isinstance(msg, P.Grant):
                    flow.grant(msg.key, msg.n)
        if time.monotonic() >= due:
            due = time.monotonic() + HEARTBEAT_INTERVAL_S
            if os.getppid() != spec.broker_pid:
                os._exit(1)
            sock.send(frame, zmq.NOBLOCK)
    sock.close()


class Worker:
    bf16_outputs: frozenset[str] = frozenset()     # sent as their bits (uint16), labelled BF16 (set at load)

    def __init__(self, spec: P.WorkerSpec) -> None:
        self.spec = spec
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, spec.identity.encode())
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(spec.workers)
        self.maps = SegmentMaps()
        self.arena = Arena(spec.server_id, f"w{os.getpid()}")
        lease_ids = itertools.count(1)          # one numbering: a Release names an arena block or an export
        self.leases = Leases(self.arena, lease_ids)
        self.exports = Exports(lease_ids)       # device outputs handed on by CUDA IPC handle
        self.imports = Imports()                # device inputs opened by handle, closed after each batch
        self.decoder = P.decoder(P.BrokerToWorker)
        self.bls = BlsClient(self)
        self.stop_requested = False   # a Stop the BLS reader received while execute() ran
        self.backend = None           # once loaded
        self.view = view = model_view(spec.config)
        self.decoupled = view.decoupled
        self.flow = Flow(view.exec_timeout_s)
        self.stream = self.ctx.socket(zmq.DEALER)     # a decoupled model's responses, from any thread
        self.stream.setsockopt(zmq.IDENTITY, P.stream_identity(spec.identity.encode()))
        self.stream.setsockopt(zmq.LINGER, 2000)
        self.stream.connect(spec.workers)
        self.stream_lock = threading.Lock()
        self.states = SequenceStates(state_specs(view, spec.config, spec.model_dir), self.arena, list(view.outputs))
        self.stateful = bool(self.states)      # decided once: a model without states skips their steps
        self.iterative = view.sequence is not None and view.sequence.iterative     # may reschedule requests

    def send(self, msg) -> None:
        self.sock.send(P.encode(msg))

    def handle_side(self, msg) -> bool:
        """Messages that may arrive at any time; True when handled."""
        if isinstance(msg, P.Release):
            for lease in msg.leases:
                if lease in self.exports:
                    self.exports.release(lease)
                else:
                    self.leases.release(lease)
            return True
        if isinstance(msg, P.Gone):
            self.maps.drop_prefix(msg.prefix)
            return True
        if isinstance(msg, P.Unmap):
            for key in msg.keys:
                self.maps.drop(key)
            return True
        if isinstance(msg, P.Observe):
            logs.apply(msg.log)
            return True
        if isinstance(msg, P.EndSequences):
            self.states.end(msg.seqs)
            return True
        if isinstance(msg, P.CheckReady):       # beside execute(), as Triton's stub runs it
            threading.Thread(target=self.check_ready, name="is_ready", daemon=True).start()
            return True
        return False

    def check_ready(self) -> None:
        ready, why = self.backend.is_ready()
        frame = P.encode(P.ReadyResult(ready, why))
        with self.stream_lock:
            self.stream.send(frame)

    def deliver(self, key: int, specs: list[P.OutputSpec], outputs: dict | None, error, final: bool,
                parameters: dict | None = None) -> None:
        """Send one response of a decoupled model's request (from whichever thread made it)."""
        empty = outputs is None and error is None
        result = write_outputs([(outputs or {}, specs, error)], self.maps, self.leases)[0]
        if self.bf16_outputs:
            label_bf16([result], self.bf16_outputs)
        frame = P.encode(P.Respond(key, result.outputs, result.error, final, empty,
                                   parameters if parameters and result.error is None else {}))
        with self.stream_lock:
            self.stream.send(frame)

    def load(self):
        s = self.spec
        limit = config_parameter(s.config, "memory_limit_bytes")
        if limit:
            if not limit.isdigit():
                raise ValueError(f"parameter memory_limit_bytes must be a number of bytes, got '{limit}'")
            limit_memory(int(limit))
        info = InstanceInfo(
            model_name=s.model, model_version=s.version, model_dir=s.model_dir,
            version_dir=s.version_dir, instance_name=s.instance_name, kind=s.kind,
            device_id=s.device_id, model_repository=s.repository, index=s.index,
            threads=s.threads, inter_op_threads=s.inter_op_threads, runtime_dir=s.runtime_dir,
        )
        apply_threads(s.threads, s.inter_op_threads)
        backend = create(s.config, self.view, info)
        completed = backend.auto_complete()
        if completed is not None:
            backend.config, backend.view = completed, model_view(completed)
            self.decoupled = backend.view.decoupled
        self.bf16_outputs = frozenset(n for n, t in backend.view.outputs.items() if t.datatype == "BF16")
        if self.view.backend == PYTHON:
            from . import pb_utils
            pb_utils.set_bls_handler(self.bls.infer, self.bls.infer_stream)
            pb_utils.set_model_control(self.bls)
        backend.load()
        if s.threads:       # the pools the model's initialize brought in (it may import torch, scipy...)
            applied = apply_threads(s.threads, s.inter_op_threads)
            log.debug("threads %d (inter-op %d) set on: %s", s.threads, s.inter_op_threads, ", ".join(applied))
        warm_up(lambda msg: self.execute(backend, msg), self.leases.release, backend.config, s.model_dir,
                s.instance_name)
        return backend, completed

    def execute(self, backend, msg: P.Exec, inline_budget: int = P.INLINE_BUDGET) -> P.BatchDone:
        """Run one batch; what the model logs meanwhile carries the batch's request ids."""
        reqs = msg.requests
        ids = reqs[0].id if len(reqs) == 1 else ",".join([r.id for r in reqs if r.id])
        token = logs.REQUEST_ID.set(ids) if ids else None
        try:
            return self._execute(backend, msg, inline_budget)
        finally:
            if token is not None:
                logs.REQUEST_ID.reset(token)

    def _execute(self, backend, msg: P.Exec, inline_budget: int) -> P.BatchDone:
        t0 = time.monotonic_ns()
        requests: list[WorkerRequest] = []
        slots: list = []
        on_device = backend.accepts_device_inputs
        into_regions = backend.writes_into_regions
        decoupled = self.decoupled
        maps, imports, flow, deliver = self.maps, self.imports, self.flow, self.deliver
        for r in msg.requests:
            try:
                inputs = {d.name: desc_to_array(d, maps, imports, on_device) for d in r.inputs}
            except Exception as e:  # malformed BYTES payload, vanished region
                err = invalid(f"failed to read inputs: {e}")
                if decoupled and not r.pad:
                    self.deliver(r.key, r.outputs, None, err, True)
                slots.append((None, r.outputs, err))
                continue
            if r.pad:
                responder = DISCARD
            else:
                responder = Responder(r.key, r.outputs, flow, deliver)
                flow.open(r.key, r.window if decoupled else 0)
            requests.append(WorkerRequest(inputs, [o.name for o in r.outputs], r.id, r.params,
                                          r.correlation_id, r.flags, r.timeout_us, responder,
                                          output_buffers(r.outputs, maps) if into_regions else None, r.trace))
            slots.append(None)
        if self.stateful:
            runs = [r for r, slot in zip(msg.requests, slots) if slot is None]
            first = next((w for w, r in zip(requests, runs) if not r.pad), None)
            for w, r in sorted(zip(requests, runs), key=lambda p: p[1].pad):
                self.states.feed(w, r.seq, r.flags, r.pad, first)
        t1 = time.monotonic_ns()
        try:
            responses = backend.execute(requests) if requests else []
            batch_error = None
        except MemoryError:
            raise
        except Exception as e:
            log.error("model '%s' instance '%s' failed to execute a batch of %d request(s)", self.spec.model,
                      self.spec.instance_name, len(requests), exc_info=e)
            responses, batch_error = [], internal(str(e) or type(e).__name__)
        t2 = time.monotonic_ns()
        again = self._rescheduled(backend, msg, slots) if self.iterative and batch_error is None else []
        if decoupled:
            if batch_error is not None:     # the backend could not run the batch at all
                for w in requests:
                    if isinstance(w.responder, Responder) and self.flow.is_open(w.responder.key):
                        w.responder.send(None, batch_error, True)
            self.close_imports()
            return P.BatchDone(msg.bid, [], t1 - t0, t2 - t1, time.monotonic_ns() - t2, rescheduled=again)
        if self.stateful and batch_error is None:
            for w, r, resp in zip(requests, runs, responses):
                self.states.keep(w, resp, r.seq, r.flags, r.pad, [o.name for o in r.outputs])
        it = iter(responses)
        per_request = []
        parameters = None       # the responses' own, by result index (a Python model may set them)
        for r, slot in zip(msg.requests, slots):
            if not r.pad:
                flow.close(r.key)
            if slot is not None:
                result = slot
            elif batch_error is not None:
                result = (None, r.outputs, batch_error)
            else:
                resp = next(it)
                result = (resp.outputs, r.outputs, resp.error)
                if resp.parameters and not r.pad:
                    parameters = parameters or {}
                    parameters[len(per_request)] = resp.parameters
            if not r.pad:
                per_request.append(result)
        results = write_outputs(per_request, self.maps, self.leases, self.exports, self.imports, inline_budget)
        if parameters:
            for i, params in parameters.items():
                results[i].parameters = params
        if self.bf16_outputs:
            label_bf16(results, self.bf16_outputs)
        self.close_imports()
        t3 = time.monotonic_ns()
        if log.isEnabledFor(logging.DEBUG):
            log_device_traffic(msg, results, on_device)
        return P.BatchDone(msg.bid, results, t1 - t0, t2 - t1, t3 - t2, t0, rescheduled=again)

    @staticmethod
    def _rescheduled(backend, msg: P.Exec, slots: list) -> list[int]:
        """The places (padding left out, as the broker counts them) of the requests the model
        released to run again; `backend.rescheduled` counts the requests it was given."""
        marked = set(backend.rescheduled)
        out, given, place = [], 0, 0
        for r, slot in zip(msg.requests, slots):
            if slot is None:
                if given in marked and not r.pad:
                    out.append(place)
                given += 1
            if not r.pad:
                place += 1
        return out

    def close_imports(self) -> None:
        """Unmap the producers' device memory this batch opened; its outputs are written."""
        try:
            self.imports.close()
        except Exception as e:  # the producer is gone; nothing of ours is left mapped
            log.warning("closing CUDA IPC inputs: %s", e)

    def run(self) -> int:
        stop = StopSignal()
        beat = threading.Thread(target=heartbeat, args=(self.ctx, self.spec, stop, self.flow), daemon=True)
        beat.start()
        try:
            backend, completed = self.load()
        except BaseException as e:
            text = str(e) or type(e).__name__
            if not isinstance(e, ModelError):     # a model's own error carries its frames; the broker logs it
                log.error("failed to load model '%s' version %d instance '%s'", self.spec.model, self.spec.version,
                          self.spec.instance_name, exc_info=e)
            self.send(P.WorkerDown(text))
            stop.set()
            beat.join(2 * HEARTBEAT_INTERVAL_S)
            stop.close()
            self.close()
            return 1
        # What loading allocated (framework modules, weights) is never garbage: keep it out of
        # the collector's way, so no collection pass over it lands on a request.
        gc.collect()
        gc.freeze()
        self.backend = backend
        self.send(P.WorkerUp(P.PROTOCOL_VERSION, os.getpid(), completed, backend.ready_hook()))
        try:
            self.serve(backend)
        except MemoryError:
            out_of_memory(self.spec.model)
        stop.set()
        try:
            backend.close()
        finally:
            beat.join(2 * HEARTBEAT_INTERVAL_S)    # its socket closes before the context ends
            stop.close()
            self.close()
        return 0

    def serve(self, backend) -> None:
        encode, inbox = P.encode, self.bls.inbox
        if self.decoupled and self.view.backend == PYTHON:
            receive, send = self.bls.next_message, self.bls.send     # BLS calls outlive execute()
        else:
            recv, decode = self.sock.recv, self.decoder.decode
            send = self.sock.send

            def receive():
                return inbox.popleft() if inbox else decode(recv())
        while not self.stop_requested:
            msg = receive()
            if isinstance(msg, P.Exec):
                done = (execute_serially(lambda one, budget: self.execute(backend, one, budget), self.flow, msg,
                                         lambda part: send(encode(part)))
                        if msg.serial else self.execute(backend, msg))
                send(encode(done))
            elif isinstance(msg, P.Stop):
                return
            elif not self.handle_side(msg):
                self.bls.stray(msg)

    def close(self) -> None:
        self.sock.close()
        with self.stream_lock:
            self.stream.close()
        self.ctx.term()
        self.maps.close()
        self.arena.close()


def label_bf16(results: list[P.ExecResult], names: frozenset[str]) -> None:
    """A BF16 output travels as its bits, which write_outputs names UINT16: name it BF16."""
    for result in results:
        for desc in result.outputs:
            if desc.name in names and desc.datatype == "UINT16":
                desc.datatype = "BF16"


def output_buffers(specs: list[P.OutputSpec], maps: SegmentMaps) -> dict[str, memoryview] | None:
    """Views of the system shared-memory regions a request's outputs go to (none for a region
    that cannot be mapped now: writing the output reports that)."""
    out = None
    for spec in specs:
        region = spec.region
        if region is None or region.key.startswith(CUDA_PREFIX):
            continue
        try:
            view = maps.view(region.key, region.offset, region.nbytes)
        except (MappingError, OSError):
            continue
        if out is None:
            out = {}
        out[spec.name] = view
    return out


def log_device_traffic(msg: P.Exec, results: list[P.ExecResult], on_device: bool) -> None:
    """With --log-verbose: how many tensors of a batch crossed by CUDA IPC handle."""
    opened = sum(1 for r in msg.requests for d in r.inputs if isinstance(d.loc, P.Device))
    exported = sum(1 for r in results for d in r.outputs if isinstance(d.loc, P.Device))
    if opened:
        log.debug("batch %d: %d input(s) opened by CUDA IPC handle, %s", msg.bid, opened,
                  "used on the device" if on_device else "copied to the host")
    if exported:
        log.debug("batch %d: %d output(s) exported by CUDA IPC handle", msg.bid, exported)


def out_of_memory(model: str) -> None:
    """Leave at once: the broker fails the batch and starts a fresh worker."""
    try:
        log.error("model '%s' ran out of memory; this worker exits", model)
    finally:
        os._exit(EXIT_NO_MEMORY)


def run_worker(spec: P.WorkerSpec) -> int:
    """Run one worker to its end, in a process spawned for it or forked from a template."""
    die_with_parent(spec.broker_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the broker stops workers by message
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # log reopening comes by message
    setproctitle(process_title(spec))
    setup_logging(spec.log_verbose, f"worker:{spec.instance_name}", spec.log)
    keep_large_allocations(WORKER_TRIM_THRESHOLD)
    return Worker(spec).run()


def process_title(spec: P.WorkerSpec) -> str:
    """What `ps` and /proc/<pid>/cmdline show: which server, model and instance this is."""
    return (f"tritond-worker server={spec.server_id} model={spec.model} version={spec.version} "
            f"instance={spec.instance_name} dir={spec.model_dir}")


def main(argv: list[str]) -> int:
    return run_worker(msgspec.json.decode(argv[1], type=P.WorkerSpec))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
