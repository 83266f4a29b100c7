"""The chaos side of perf/soak.py: what it does to the server, and how it looks at the server's
processes and shared memory.

Actions: SIGKILL a worker, reload a model by an explicit load carrying a `config` parameter,
open slow connections (half a request head, a body that stops), send malformed requests (HTTP
and gRPC). Each records what it did and what the server answered; `ProcessTable` takes the RSS
and open descriptors of every process of the server's session.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field

import grpc

from tritond.perf.loadgen import HttpConnection

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


# ---------------------------------------------------------------- processes

def session_processes(sid: int) -> dict[int, str]:
    """Live processes of the session `sid` (the supervisor's pid): pid -> role."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z" or int(fields[3]) != sid:
            continue
        out[int(entry)] = role_of(int(entry), argv, sid)
    return out


def role_of(pid: int, argv: list[bytes], sid: int) -> str:
    if pid == sid:
        return "supervisor"
    if argv and argv[0].startswith(b"tritond-worker"):
        title = dict(w.split("=", 1) for w in b" ".join(argv).decode(errors="replace").split()[1:] if "=" in w)
        return f"worker {title.get('model')}/{title.get('instance')}"
    for module, role in ((b"tritond.broker.main", "broker"), (b"tritond.frontend.http", "http frontend"),
                         (b"tritond.frontend.grpc", "grpc frontend"), (b"tritond.workers.template", "template")):
        if any(module in a for a in argv):
            return role
    return "other: " + b" ".join(argv[:3]).decode(errors="replace")


def usage(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open descriptors) of a process; (0, 0) when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


@dataclass
class ProcessTable:
    """RSS and descriptors per role at the start and at the end (a restarted worker's role keeps
    its first sample as the start and its latest as the end)."""
    start: dict[str, tuple[int, int, int]] = field(default_factory=dict)   # role -> (pid, rss, fds)
    end: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def sample(self, sid: int, which: dict[str, tuple[int, int, int]]) -> None:
        seen: dict[str, int] = {}
        for pid, role in sorted(session_processes(sid).items()):
            seen[role] = seen.get(role, 0) + 1
            key = role if seen[role] == 1 else f"{role} #{seen[role]}"
            which[key] = (pid, *usage(pid))

    def lines(self) -> list[str]:
        out = [f"{'process':34} {'pid start':>9} {'pid end':>8} {'RSS MiB start':>13} {'end':>6} "
               f"{'fds start':>9} {'end':>5}"]
        for role in sorted(set(self.start) | set(self.end)):
            p0, r0, f0 = self.start.get(role, (0, 0, 0))
            p1, r1, f1 = self.end.get(role, (0, 0, 0))
            out.append(f"{role:34} {p0:>9} {p1:>8} {r0 / 1024:>13.1f} {r1 / 1024:>6.1f} {f0:>9} {f1:>5}")
        return out


def orphans(sid: int, broker_pid: int) -> list[int]:
    """Workers whose parent is not the live broker (left behind by a dead one)."""
    out = []
    for pid, role in session_processes(sid).items():
        if role.startswith("worker"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) != broker_pid:
                out.append(pid)
    return out


def shm_usage(server_id: str) -> tuple[int, int]:
    """(segments, bytes) of this server in /dev/shm."""
    names = [n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{server_id}.")]
    size = 0
    for n in names:
        try:
            size += os.stat(f"/dev/shm/{n}").st_blocks * 512
        except OSError:
            pass
    return len(names), size


# ---------------------------------------------------------------- chaos actions

@dataclass
class ChaosLog:
    kills: list[tuple[float, int, str]] = field(default_factory=list)      # (when, pid, role)
    reloads: int = 0
    reloads_failed: list[str] = field(default_factory=list)
    slow_opened: int = 0
    slow_closed: int = 0                  # closed by the server within the limits
    malformed: int = 0
    malformed_unexpected: list[str] = field(default_factory=list)       # answers other than 4xx


class Chaos:
    def __init__(self, http: tuple[str, int], grpc_target: str, sid: int, log: ChaosLog,
                 victims: tuple[str, ...], reload_model: str, reload_config: dict, slow_limit_s: float,
                 shm_key: str) -> None:
        self.host, self.port = http
        self.grpc_target = grpc_target
        self.sid = sid
        self.log = log
        self.victims = victims
        self.reload_model = reload_model
        self.reload_config = reload_config
        self.slow_limit_s = slow_limit_s
        self.shm_key = shm_key              # an existing object, registered with zero bytes
        self.rng = random.Random(0)
        self.tasks: set[asyncio.Task] = set()

    async def kill(self) -> None:
        workers = [(pid, role) for pid, role in session_processes(self.sid).items()
                   if role.startswith("worker") and role.split()[1].split("/")[0] in self.victims]
        if workers:
            pid, role = self.rng.choice(sorted(workers))
            os.kill(pid, signal.SIGKILL)
            self.log.kills.append((time.monotonic(), pid, role))

    async def reload(self) -> None:
        """An explicit load carrying a config parameter (alternating the model's sleep)."""
        config = json.loads(json.dumps(self.reload_config))
        config["parameters"]["sleep_ms"] = {"string_value": str(self.log.reloads % 2)}
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        status, reply = await self._send(f"/v2/repository/models/{self.reload_model}/load", body)
        self.log.reloads += 1
        if status != 200:
            self.log.reloads_failed.append(f"{status} {reply[:200]!r}")

    async def slow(self, count: int = 20) -> None:
        """Half-sent heads and stalled bodies; the server must close each within its limits."""
        for i in range(count):
            reader, writer = await asyncio.open_connection(self.host, self.port)
            if i % 2:
                writer.write(f"GET /v2/health/ready HTTP/1.1\r\nHost: {self.host}\r\nX-Slow: ".encode())
            else:
                writer.write(self._request("/v2/models/soak/infer", b"")[:-4].replace(
                    b"Content-Length: 0", b"Content-Length: 1000") + b"\r\n\r\n{\"inputs\"")
            await writer.drain()
            self.log.slow_opened += 1
            task = asyncio.create_task(self._closed_by_server(reader, writer))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _closed_by_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.read(), self.slow_limit_s)
            self.log.slow_closed += 1
        except (asyncio.TimeoutError, OSError):
            pass
        finally:
            writer.close()

    async def malformed(self) -> None:
        """Requests a careless or hostile client sends; each must get a 4xx (INVALID_ARGUMENT)."""
        bad_http = [
            ("/v2/models/soak/infer", b"{not json"),
            ("/v2/models/soak/infer", b'{"inputs":[{"name":"INPUT0","shape":[1,1099511627776],"datatype":"FP32",'
                                      b'"data":[1]}]}'),
            ("/v2/models/soak/infer", b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":['
                                      + b",".join([b"1"] * 5000) + b"]}]}"),
            ("/v2/models/soak/infer", b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT8",'
                                      b'"data":[1]}]}'),
            ("/v2/models/nope/infer", b'{"inputs":[]}'),
            ("/v2/models/soak/infer", b'{"inputs":' + b"[" * 5000 + b"]" * 5000 + b"}"),
            ("/v2/repository/models/..%00/load", b""),
            ("/v2/systemsharedmemory/region/z/register",
             json.dumps({"key": self.shm_key, "offset": 0, "byte_size": 0}).encode()),
        ]
        for path, body in bad_http:
            status, reply = await self._send(path, body)
            self._expect_4xx(f"HTTP {path}", status, reply)
        async with grpc.aio.insecure_channel(self.grpc_target) as channel:
            for payload in (b"\xff\xff\xff\x0f", b"\x0a\x05soak\x12"):
                try:
                    await channel.unary_unary(MODEL_INFER)(payload, timeout=10)
                    self._expect_4xx("gRPC ModelInfer", 200, b"")
                except grpc.RpcError as e:
                    ok = e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
                    self._expect_4xx("gRPC ModelInfer", 400 if ok else 500, (e.details() or "").encode())

    def _expect_4xx(self, what: str, status: int, reply: bytes) -> None:
        self.log.malformed += 1
        if not 400 <= status < 500:
            self.log.malformed_unexpected.append(f"{what}: {status} {reply[:160]!r}")

    async def _send(self, path: str, body: bytes) -> tuple[int, bytes]:
        """One request on a connection of its own (0: closed without an answer)."""
        conn = HttpConnection(self.host, self.port)
        try:
            return await conn.send(self._request(path, body))
        except (OSError, asyncio.IncompleteReadError) as e:
            return 0, repr(e).encode()
        finally:
            conn.close()

    def _request(self, path: str, body: bytes) -> bytes:
        return (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def close(self) -> None:
        for task in list(self.tasks):
            await task
