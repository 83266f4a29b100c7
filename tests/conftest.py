"""Shared test helpers: build the example repository, run real tritond servers (`serving`
starts one and checks it went away cleanly), wait for a condition (`wait_for`) and check a
client error (`expect_error`). tests/unit/test_helpers_once.py keeps them defined only here.

Every server runs in its own session (process group leader = the supervisor), so a test
can find every process it left behind; its shared-memory segments carry its server id.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG_DIR: str | None = None   # server logs go under pytest's temporary directory


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, what: str | Callable[[], str] = "condition",
             every: float = 0.05, sleep: Callable[[float], Any] = time.sleep) -> T:
    """Call `predicate` every `every` seconds until it returns a true value, and return that
    value; after `timeout` seconds fail with `what` (a text, or a function giving one then)
    and the last value. `sleep` is what waits between calls (gevent.sleep for gevent clients)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {text} (last: {value!r})")
        sleep(min(every, left))


# The gRPC status Triton gives for an HTTP status (tritonclient's gRPC errors read "StatusCode.<name>").
GRPC_CODE = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 500: "INTERNAL", 501: "UNIMPLEMENTED",
             503: "UNAVAILABLE"}


def expect_error(fn: Callable[[], Any], status: int | None = None, text: str | None = None, *,
                 protocol: str = "http", grpc_code: str | None = None, exact: bool = False,
                 absent: tuple[str, ...] = ()):
    """Call `fn`, which must raise the clients' InferenceServerException, and return it.

    status: the HTTP status it carries; with protocol="grpc" the gRPC code that status maps to
    (GRPC_CODE), or `grpc_code` when given. text: in the message (exact: the whole message).
    absent: texts the message must not contain."""
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException) as info:
        fn()
    error = info.value
    message = error.message()
    if status is not None or grpc_code is not None:
        if protocol == "http":
            assert error.status() == str(status), message
        else:
            assert protocol == "grpc", protocol
            assert error.status() == f"StatusCode.{grpc_code or GRPC_CODE[status]}", message
    if text is not None:
        assert (message == text) if exact else (text in message), message
    for word in absent:
        assert word not in message, message
    return error


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Example models whose workers import a large framework (seconds per server start); only the
# tests of those backends build them (build_example_repository(dest, FRAMEWORK_MODELS)).
FRAMEWORK_MODELS = ("mlp_openvino", "mlp_tensorflow")


def build_example_repository(dest: Path, models: tuple[str, ...] | None = None) -> Path:
    """Build the example repository into dest: `models`, or every model but FRAMEWORK_MODELS."""
    spec = importlib.util.spec_from_file_location("build_repository", ROOT / "examples" / "build_repository.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if models is None:
        models = tuple(p.name for p in (ROOT / "examples" / "model_repository").iterdir()
                       if p.is_dir() and p.name not in FRAMEWORK_MODELS)
    mod.build(str(dest), models)
    return dest


def http_get(url: str, timeout: float = 5.0, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def metric(server: "TritondServer", name: str, default: float | None = None, **labels: str) -> float:
    """The value of the one sample of `name` on the server's /metrics whose labels include
    `labels`; `default` when there is none (None: fail)."""
    from prometheus_client.parser import text_string_to_metric_families
    status, body = http_get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    assert status == 200, body
    found = [s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
             if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    if found:
        return found[0]
    assert default is not None, f"no {name} {labels} in /metrics"
    return default


def session_pids(sid: int) -> list[int]:
    """Live processes whose session id is `sid` (the supervisor's pid)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds (none when it is gone)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def tcp_connections() -> list[tuple[int, int, int]]:
    """(local port, remote port, socket inode) of every ESTABLISHED TCP connection on this host."""
    rows = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "01":
                    rows.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16),
                                 int(fields[9])))
    return rows


def worker_title(pid: int) -> dict[str, str] | None:
    """The fields of a worker's process title (`tritond-worker server=... model=... ...`), or
    None when `pid` is not a worker."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return None
    if not words or words[0] != "tritond-worker":
        return None
    head, _, model_dir = " ".join(words).partition(" dir=")
    return dict(w.split("=", 1) for w in head.split()[1:] if "=" in w) | {"dir": model_dir}


# The head of a default or ISO8601 log line, before a message that Triton's escaping wrote as a JSON string.
_ESCAPED_LINE = re.compile(r'^((?:[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [IWE]) '
                           r'\d+ [^\]]+\] )(".*")$')


def _unescaped(line: str) -> str:
    m = _ESCAPED_LINE.match(line)
    if m is None:
        return line
    try:
        return m.group(1) + json.loads(m.group(2))
    except ValueError:
        return line


class TritondServer:
    """One `tritond start` on free loopback ports."""

    def __init__(self, repos: list[Path] | Path, args: list[str] | None = None, grpc: bool = True,
                 env: dict[str, str] | None = None, https: ssl.SSLContext | None = None) -> None:
        self.repos = [repos] if isinstance(repos, (str, Path)) else list(repos)
        self.args = list(args or [])
        self.grpc = grpc
        self.env = env
        self.https = https   # the client context that readiness checks use when HTTP is served over TLS
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.returncode: int | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tritond.cli", "start"]
        for r in self.repos:
            cmd += ["--model-repository", str(r)]
        cmd += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                "--metrics-port", str(self.metrics_port)]
        if not self.grpc:
            cmd.append("--allow-grpc=false")
        return cmd + self.args

    def launch(self) -> "TritondServer":
        """Start the process (its output goes to the log) without waiting for anything."""
        import tempfile
        fd, path = tempfile.mkstemp(prefix="tritond-test-", suffix=".log", dir=LOG_DIR)
        self.log_path = Path(path)
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(self.command(), stdout=fd, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=str(ROOT))
        os.close(fd)
        return self

    def start(self, wait: str = "ready", timeout: float = 120.0) -> "TritondServer":
        """Start and wait until `wait` is 'ready', 'live', 'metadata' (it answers /v2), or 'exit'
        (a startup expected to fail)."""
        self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                if wait == "exit":
                    return self
                raise RuntimeError(f"tritond exited with {self.proc.returncode} during startup:\n{self.log}")
            if wait != "exit":
                scheme = "https" if self.https else "http"
                path = "/v2" if wait == "metadata" else f"/v2/health/{wait}"
                status, _ = http_get(f"{scheme}://{self.http_url}{path}", 1.0, self.https)
                if status == 200 and (not self.grpc or self._grpc_listening()):
                    return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"tritond did not become {wait} within {timeout}s:\n{self.log}")

    def _grpc_listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.grpc_port), timeout=0.5):
                return True
        except OSError:
            return False

    @property
    def log(self) -> str:
        """The server's output, each message as it was said (multi-line, unquoted), whether
        or not the log escaped it (test_log_escaping.py reads the escaped lines themselves)."""
        raw = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
        return "\n".join(_unescaped(line) for line in raw.split("\n"))

    @property
    def log_outside_tables(self) -> str:
        """The log without the rows of Triton's start-up model table, which repeats each
        failure's reason: what a test counts when a message must be said once."""
        return "\n".join(line for line in self.log.splitlines() if not line.startswith(("|", "+-")))

    @property
    def server_id(self) -> str:
        m = re.search(r"server id ([0-9a-f]{32})", self.log)
        return m.group(1) if m else ""

    def segments(self) -> list[str]:
        sid = self.server_id
        if not sid:
            return []
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{sid}."))

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid) if self.proc else []

    def worker_pids(self, model: str | None = None) -> list[int]:
        """Worker processes, optionally of one model (from their process title)."""
        out = []
        for pid in self.pids():
            title = worker_title(pid)
            if title is not None and (model is None or title.get("model") == model):
                out.append(pid)
        return out

    def role_pids(self, module: str) -> list[int]:
        out = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if module.encode() in f.read():
                        out.append(pid)
            except OSError:
                continue
        return out

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.returncode = self.proc.returncode
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.returncode

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        from tritond.shm.naming import sweep
        if self.server_id:
            sweep(f"tritond.{self.server_id}.")

    def assert_clean(self) -> None:
        """Nothing of this server may remain: no process, no shared-memory segment."""
        leftover = self.pids()
        segments = self.segments()
        if leftover or segments:
            self.kill()
        assert not leftover, f"processes left behind: {leftover}"
        assert not segments, f"shared-memory segments left behind: {segments}"


@contextmanager
def serving(server: TritondServer, wait: str = "ready", timeout: float = 120.0,
            code: int | None = 0) -> Iterator[TritondServer]:
    """Start `server` (unless the caller already has), yield it, then stop it and assert that
    it left no process and no shared-memory segment and exited with `code` (None: any code).
    A body that raises still stops the server (and kills what remains), then re-raises."""
    if server.proc is None:
        server.start(wait=wait, timeout=timeout)
    try:
        yield server
    except BaseException:
        server.stop()
        if server.pids() or server.segments():
            server.kill()
        raise
    returncode = server.stop()
    server.assert_clean()
    if code is not None:
        assert returncode == code, server.log


@pytest.fixture(scope="session", autouse=True)
def server_log_dir(tmp_path_factory) -> Path:
    global LOG_DIR
    path = tmp_path_factory.mktemp("server-logs")
    LOG_DIR = str(path)
    return path


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory) -> Path:
    return build_example_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def server(example_repo):
    """The example repository served with client shared memory allowed."""
    with serving(TritondServer(example_repo, ["--allow-client-shm=true"])) as s:
        yield s


@pytest.fixture(scope="session")
def streaming_server(tmp_path_factory):
    """The sequence and streaming tests' models (tests/stream_models.py) on one server."""
    from stream_models import streaming_repository
    with serving(TritondServer(streaming_repository(tmp_path_factory.mktemp("streaming") / "models"))) as s:
        yield s
