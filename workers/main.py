"""A worker process: load one model instance, then execute batches until told to stop.

`python -m tritond.workers.main <spec-json>`; spawned by the broker with an argv list.
The main thread computes; a heartbeat thread keeps telling the broker it is alive (and
exits the process if the broker is gone), so a long batch is never mistaken for a hang.
A config parameter `memory_limit_bytes` caps what the model may allocate; a MemoryError
anywhere ends the process with EXIT_NO_MEMORY, since its state can no longer be trusted,
and the broker restarts it.
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import threading
import time

import msgspec
import zmq

from tritond import logs
from tritond.process import EXIT_NO_MEMORY, die_with_parent, limit_memory, setup_logging
from tritond.repository.parameters import config_parameter
from tritond.shm.arena import Arena
from tritond.shm.mapping import SegmentMaps
from tritond.wire import schema as P
from tritond.wire.errors import internal, invalid

from .backends import create
from .backends.base import InstanceInfo, WorkerRequest
from .bls import BlsClient
from .cuda_ipc import Exports, Imports
from .tensors import Leases, desc_to_array, write_outputs

log = logging.getLogger("tritond.worker")

HEARTBEAT_INTERVAL_S = 0.5


def heartbeat(ctx: zmq.Context, spec: P.WorkerSpec, stop: threading.Event) -> None:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, P.heartbeat_identity(spec.identity.encode()))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(spec.workers)
    frame = P.encode(P.Heartbeat())
    while not stop.wait(HEARTBEAT_INTERVAL_S):
        if os.getppid() != spec.broker_pid:
            os._exit(1)
        sock.send(frame, zmq.NOBLOCK)
    sock.close()


class Worker:
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
        return False

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
        )
        backend = create(s.config, info)
        completed = backend.auto_complete()
        if completed is not None:
            backend.config = completed
        if s.config.get("backend") == "python":
            from . import pb_utils
            pb_utils.set_bls_handler(self.bls.infer)
        backend.load()
        return backend, completed

    def execute(self, backend, msg: P.Exec) -> P.BatchDone:
        """Run one batch; what the model logs meanwhile carries the batch's request ids."""
        ids = ",".join(r.id for r in msg.requests if r.id)
        token = logs.REQUEST_ID.set(ids) if ids else None
        try:
            return self._execute(backend, msg)
        finally:
            if token is not None:
                logs.REQUEST_ID.reset(token)

    def _execute(self, backend, msg: P.Exec) -> P.BatchDone:
        t0 = time.monotonic_ns()
        requests: list[WorkerRequest] = []
        slots: list = []
        on_device = backend.accepts_device_inputs
        for r in msg.requests:
            try:
                inputs = {d.name: desc_to_array(d, self.maps, self.imports, on_device) for d in r.inputs}
            except Exception as e:  # malformed BYTES payload, vanished region
                slots.append((None, r.outputs, invalid(f"failed to read inputs: {e}")))
                continue
            requests.append(WorkerRequest(inputs, [o.name for o in r.outputs], r.id, r.params,
                                          r.correlation_id, r.flags, r.timeout_us))
            slots.append(None)
        t1 = time.monotonic_ns()
        try:
            responses = backend.execute(requests) if requests else []
            batch_error = None
        except MemoryError:
            raise
        except Exception as e:
            responses, batch_error = [], internal(str(e) or type(e).__name__)
        t2 = time.monotonic_ns()
        it = iter(responses)
        per_request = []
        for r, slot in zip(msg.requests, slots):
            if slot is not None:
                per_request.append(slot)
            elif batch_error is not None:
                per_request.append((None, r.outputs, batch_error))
            else:
                resp = next(it)
                per_request.append((resp.outputs, r.outputs, resp.error))
        results = write_outputs(per_request, self.maps, self.leases, self.exports, self.imports)
        self.close_imports()
        t3 = time.monotonic_ns()
        if log.isEnabledFor(logging.DEBUG):
            log_device_traffic(msg, results, on_device)
        return P.BatchDone(msg.bid, results, t1 - t0, t2 - t1, t3 - t2, t0)

    def close_imports(self) -> None:
        """Unmap the producers' device memory this batch opened; its outputs are written."""
        try:
            self.imports.close()
        except Exception as e:  # the producer is gone; nothing of ours is left mapped
            log.warning("closing CUDA IPC inputs: %s", e)

    def run(self) -> int:
        stop = threading.Event()
        threading.Thread(target=heartbeat, args=(self.ctx, self.spec, stop), daemon=True).start()
        try:
            backend, completed = self.load()
        except BaseException as e:
            text = str(e) or type(e).__name__
            log.error("failed to load model '%s': %s", self.spec.model, text)
            self.send(P.WorkerDown(text))
            stop.set()
            self.close()
            return 1
        self.send(P.WorkerUp(P.PROTOCOL_VERSION, os.getpid(), completed))
        try:
            self.serve(backend)
        except MemoryError:
            out_of_memory(self.spec.model)
        stop.set()
        try:
            backend.close()
        finally:
            self.close()
        return 0

    def serve(self, backend) -> None:
        while not self.stop_requested:
            msg = self.decoder.decode(self.sock.recv())
            if isinstance(msg, P.Exec):
                self.send(self.execute(backend, msg))
            elif isinstance(msg, P.Stop):
                return
            elif not self.handle_side(msg):
                self.bls.stray(msg)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
        self.maps.close()
        self.arena.close()


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


def main(argv: list[str]) -> int:
    spec = msgspec.json.decode(argv[1], type=P.WorkerSpec)
    die_with_parent(spec.broker_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the broker stops workers by message
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # log reopening comes by message
    setup_logging(spec.log_verbose, f"worker:{spec.instance_name}", spec.log)
    return Worker(spec).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
