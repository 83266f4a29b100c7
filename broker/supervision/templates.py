"""Warm templates, one per backend kind, that fork CPU workers (workers/template.py).

A template imports its framework once; every worker forked from it shares that code and
heap copy-on-write, so an extra worker costs what it writes, not a framework import. Which
workers are forked: CPU instances of the backends whose record (repository/backends.py) says
`forked`: python, onnxruntime and pytorch. Spawned
fresh instead: GPU instances (a CUDA context must not be inherited), models with their own
Python environment (EXECUTION_ENV_PATH), models with `memory_limit_bytes` (the limit would
count the template's heap), kinds whose import starts Python threads (openvino, tensorflow;
a template also refuses to fork if that happens), and any worker whose template is not ready
when it is needed after startup, so the broker's loop never waits for an import.

A template that dies is started again the next time its kind is needed.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import struct
import subprocess
import sys
import time

import msgspec

from tritond.repository.backends import record_for
from tritond.repository.parameters import config_parameter
from tritond.wire.schema import WorkerSpec

log = logging.getLogger("tritond.broker")

FORK_TIMEOUT_S = 10.0
READY = b"R"
REFUSED = 2         # the template's exit code when its import started threads


def template_kind(spec: WorkerSpec) -> str | None:
    """The template that may fork `spec`'s worker, or None when it must be spawned."""
    config = spec.config
    if spec.kind != "CPU" or config_parameter(config, "memory_limit_bytes"):
        return None
    if config_parameter(config, "EXECUTION_ENV_PATH"):
        return None
    record = record_for(config.get("backend") or "", config.get("platform") or "", config.get("runtime") or "")
    return record.name if record is not None and record.forked else None


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


class Template:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "tritond.workers.template", kind, str(os.getpid()), str(theirs.fileno())]
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=True, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False
        self.broken = False
        self.refused = False          # its import started threads: this kind is never forked
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> bool:
        """True once the template has imported its framework (waits up to `timeout`)."""
        if self.ready or self.broken:
            return self.ready
        readable, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not readable:
            return False
        if self._recv() == READY:
            self.ready = True
            log.info("the %s template (pid %d) is ready after %.2f s", self.kind, self.pid,
                     time.monotonic() - self.started)
            return True
        try:
            self.refused = self.proc.wait(5.0) == REFUSED
        except subprocess.TimeoutExpired:
            pass
        self._break("importing its framework started threads" if self.refused else
                    "it exited while importing its framework")
        return False

    def fork(self, spec: WorkerSpec) -> int | None:
        """The pid of a worker forked for `spec` (a child of the broker), or None."""
        try:
            self.sock.settimeout(FORK_TIMEOUT_S)
            self.sock.sendall(_frame(msgspec.json.encode(spec)))
            answer = self._recv()
        except OSError as e:
            self._break(f"it did not answer a fork request ({e})")
            return None
        if answer is None or len(answer) != 8:
            self._break("it closed its socket")
            return None
        pid = struct.unpack("<q", answer)[0]
        return pid if pid > 0 else None

    def _recv(self) -> bytes | None:
        head = self._exact(4)
        return None if head is None else self._exact(struct.unpack("<I", head)[0])

    def _exact(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def _break(self, why: str) -> None:
        if not self.broken:
            log.warning("the %s template (pid %d) is not used: %s; its workers are spawned", self.kind, self.pid, why)
        self.broken = True
        self.close()

    def close(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Templates:
    """The templates of this broker, started on first need."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._by_kind: dict[str, Template] = {}
        self._unforkable: set[str] = set()      # kinds whose template refused (threads at import)
        self.wait_s = 0.0                       # how long a fork may wait for a starting template

    def fork(self, spec: WorkerSpec) -> int | None:
        """A worker forked for `spec`, or None when it must be spawned."""
        template = self._ready(spec, self.wait_s)
        return template.fork(spec) if template is not None else None

    def warm(self, spec: WorkerSpec, timeout: float) -> None:
        """Start the template that would fork `spec`'s worker, waiting up to `timeout` for its
        import: workers started later (paged in) find it ready."""
        self._ready(spec, timeout)

    def _ready(self, spec: WorkerSpec, wait_s: float) -> Template | None:
        kind = template_kind(spec) if self.enabled else None
        if kind is None or kind in self._unforkable:
            return None
        template = self._by_kind.get(kind)
        if template is None or template.broken or template.proc.poll() is not None:
            template = self._by_kind[kind] = Template(kind)
        if not template.wait_ready(wait_s):
            if template.refused:
                self._unforkable.add(kind)
            return None
        return template

    def pids(self) -> set[int]:
        return {t.pid for t in self._by_kind.values()}

    def close(self) -> None:
        for t in self._by_kind.values():
            t.close()
        self._by_kind.clear()
