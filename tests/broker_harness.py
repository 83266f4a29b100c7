"""The real broker, driven in-process: no sockets bound, no processes, a fake clock.

`Harness` builds `Broker` with stand-in sockets (every frame it sends is decoded and kept),
stand-in worker processes (spawning records the instance; exits happen when a test says so)
and a clock the test advances. Tests speak to it with the same messages frontends and
workers send, so the broker's own code decides everything.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from tritond.broker.clock import Clock
from tritond.broker.lifecycle.jobs import InlineJobs
from tritond.broker.supervision.pool import Instance, InstanceState, WorkerProcesses
from tritond.broker.server import Broker
from tritond.wire import options as wire_options, schema as S

SERVER_ID = "0" * 32


class FakeClock(Clock):
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def now_ns(self) -> int:
        return int(self.t * 1e9)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeSockets:
    def __init__(self) -> None:
        self.frontend: list[tuple[bytes, Any]] = []
        self.worker: list[tuple[bytes, Any]] = []
        self._fe = S.decoder(S.BrokerToFrontend)
        self._wk = S.decoder(S.BrokerToWorker)

    def to_frontend(self, ident: bytes, frame: bytes) -> None:
        self.frontend.append((ident, self._fe.decode(frame)))

    def to_worker(self, ident: bytes, frame: bytes) -> None:
        self.worker.append((ident, self._wk.decode(frame)))

    def worker_pending(self) -> bool:
        return False

    def wait_briefly(self, seconds: float) -> None:
        pass


class FakePool(WorkerProcesses):
    """Worker processes that exist only as records: alive until the test ends them."""

    def __init__(self) -> None:
        super().__init__()
        self.pids = itertools.count(50000)
        self.live: dict[int, Instance] = {}
        self.exit_codes: dict[int, int] = {}
        self.specs: dict[bytes, S.WorkerSpec] = {}
        self.killed: list[str] = []

    def spawn(self, inst: Instance, spec: S.WorkerSpec, env: dict[str, str] | None) -> None:
        inst.pid = next(self.pids)
        inst.pidfd = inst.pid           # unique, and never a real descriptor
        self.live[inst.pid] = inst
        self.specs[inst.identity] = spec

    def alive(self, inst: Instance) -> bool:
        return inst.pid in self.live and inst.pid not in self.exit_codes

    def kill(self, inst: Instance, sig: int = 9) -> None:
        if self.alive(inst):
            self.killed.append(inst.name)
            self.exit_codes[inst.pid] = -sig

    def end(self, inst: Instance, code: int) -> None:
        self.exit_codes.setdefault(inst.pid, code)

    def reap(self, inst: Instance) -> int:
        self.live.pop(inst.pid, None)
        inst.pidfd = -1
        return self.exit_codes.pop(inst.pid)

    def wait(self, inst: Instance, timeout: float) -> bool:
        return not self.alive(inst)


def python_model(repo: Path, name: str, inputs: list[str], outputs: list[str], extra: str = "",
                 max_batch_size: int = 0) -> None:
    """A Python-backend model directory (its model.py never runs here)."""
    tensors = [f'input {{ name: "{i}" data_type: TYPE_FP32 dims: [-1] }}' for i in inputs]
    tensors += [f'output {{ name: "{o}" data_type: TYPE_FP32 dims: [-1] }}' for o in outputs]
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text("")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}" backend: "python" max_batch_size: {max_batch_size} ' + " ".join(tensors) + " " + extra)


def ensemble_model(repo: Path, name: str, text: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)


class Harness:
    def __init__(self, repo: Path, **opts: Any) -> None:
        self.opts = wire_options.build({"model_repositories": [str(repo)], "server_id": SERVER_ID,
                                        "run_dir": str(repo), "supervisor_pid": -1, **opts})
        self.clock = FakeClock()
        self.sockets = FakeSockets()
        self.pool = FakePool()
        self.broker = Broker(self.opts, self.sockets, self.pool, self.clock, InlineJobs())
        self.rids = itertools.count(1)
        self.cids = itertools.count(1)

    # ---------------------------------------------------------------- lifecycle

    def load(self, *ready: str) -> "Harness":
        """Load the repository; the workers of `ready` models (all: '*') report up."""
        self.broker.model_ops.startup()
        self.broker.jobs.collect()
        self.up(*ready)
        return self

    def instances(self, model: str | None = None, state: InstanceState | None = None) -> list[Instance]:
        return [i for mv in self.broker.registry.all_versions() for i in mv.instances
                if (model is None or mv.name == model) and (state is None or i.state is state)]

    def up(self, *models: str, config: dict | None = None) -> None:
        for inst in self.instances(state=InstanceState.STARTING):
            if "*" in models or inst.model in models:
                self.from_worker(inst, S.WorkerUp(S.PROTOCOL_VERSION, inst.pid, config))

    def from_worker(self, inst: Instance, msg: Any, heartbeat: bool = False) -> None:
        ident = S.heartbeat_identity(inst.identity) if heartbeat else inst.identity
        self.broker.on_worker_frame(ident, S.encode(msg))
        self.broker.end_turn()

    def from_stream(self, inst: Instance, *msgs: Any) -> None:
        """Messages on a worker's stream socket (a decoupled model's responses), in one loop turn."""
        for msg in msgs:
            self.broker.on_worker_frame(S.stream_identity(inst.identity), S.encode(msg))
        self.broker.end_turn()

    def from_frontend(self, msg: Any, ident: bytes = b"fe") -> None:
        self.broker.on_frontend_frame(ident, S.encode(msg))
        self.broker.end_turn()

    def from_frontend_turn(self, *msgs: Any, ident: bytes = b"fe") -> None:
        """Frames from a frontend that arrive in one loop turn."""
        for msg in msgs:
            self.broker.on_frontend_frame(ident, S.encode(msg))
        self.broker.end_turn()

    def die(self, inst: Instance, code: int = -9) -> None:
        """The worker process of `inst` ends (its pidfd turns readable)."""
        self.pool.end(inst, code)
        self.broker.on_worker_exit(inst)
        self.broker.end_turn()

    def tick(self, seconds: float = 0.0) -> float:
        self.clock.advance(seconds)
        self.broker.jobs.collect()
        wait = self.broker.timers()
        self.broker.end_turn()
        return wait

    # ---------------------------------------------------------------- requests

    def infer(self, model: str, ident: bytes = b"fe", outputs: tuple[S.OutputSpec, ...] = (),
              **inputs: np.ndarray) -> int:
        rid = next(self.rids)
        descs = [S.TensorDesc(n, "FP32", list(a.shape), S.Inline(np.asarray(a, np.float32).tobytes()))
                 for n, a in inputs.items()]
        self.from_frontend(S.Infer(rid, model, -1, descs, list(outputs)), ident)
        return rid

    def control(self, op: Any, ident: bytes = b"fe") -> Any:
        """Send a control operation; its reply if it was answered at once, else None."""
        cid = next(self.cids)
        self.from_frontend(S.Control(cid, op), ident)
        self.broker.jobs.collect()
        for _, msg in self.to_frontends(S.ControlReply):
            if msg.cid == cid:
                return msg
        return None

    def to_frontends(self, kind: type) -> list[tuple[bytes, Any]]:
        return [(i, m) for i, m in self.sockets.frontend if isinstance(m, kind)]

    def replies(self, ident: bytes = b"fe") -> dict[int, S.InferReply]:
        return {m.rid: m for m in self.frontend_replies(ident)}

    def frontend_replies(self, ident: bytes = b"fe") -> list[S.InferReply]:
        """Every InferReply sent to frontend `ident`, in order (a Replies frame unpacked)."""
        out: list[S.InferReply] = []
        for i, m in self.sockets.frontend:
            if i == ident and isinstance(m, S.InferReply):
                out.append(m)
            elif i == ident and isinstance(m, S.Replies):
                out.extend(m.replies)
        return out

    def to_workers(self, kind: type) -> list[tuple[bytes, Any]]:
        return [(i, m) for i, m in self.sockets.worker if isinstance(m, kind)]

    def executing(self, model: str) -> list[tuple[Instance, S.Exec]]:
        """Batches sent to `model`'s instances and not answered yet."""
        by_ident = {i.identity: i for i in self.instances(model)}
        return [(by_ident[ident], m) for ident, m in self.to_workers(S.Exec)
                if ident in by_ident and by_ident[ident].batch == m.bid]

    def answer(self, inst: Instance, exec_msg: S.Exec, *results: S.ExecResult | dict[str, S.Loc]) -> None:
        """The worker answers a batch: one result per request, an ExecResult or {output: loc}."""
        out = []
        for r in results:
            if isinstance(r, dict):
                r = S.ExecResult([S.TensorDesc(n, "FP32", [1], loc) for n, loc in r.items()])
            out.append(r)
        self.from_worker(inst, S.BatchDone(exec_msg.bid, out))

    def released(self) -> list[tuple[bytes, int]]:
        """Every (owner, lease) released to a worker so far."""
        return sorted((i, lease) for i, m in self.to_workers(S.Release) for lease in m.leases)
