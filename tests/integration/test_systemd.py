"""systemd's Type=notify protocol against a real NOTIFY_SOCKET datagram socket: READY=1 only
once every frontend process serves, STATUS= lines, WATCHDOG=1 only while the broker is healthy
(a hung broker is killed and restarted), STOPPING=1 on drain."""
from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import tritonclient.grpc as grpcclient

from conftest import TritondServer, serving, wait_for

HANG_S = 6.0


class NotifySocket:
    """What systemd does with NOTIFY_SOCKET: a bound datagram socket; here every datagram
    is kept with its arrival time, and `on_ready` runs when READY=1 arrives."""

    def __init__(self, path: Path, on_ready) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.path = str(path)
        self.on_ready = on_ready
        self.messages: list[tuple[float, dict[str, str]]] = []
        self.ready_checks: list[object] = []
        self.done = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.monotonic(), fields))
            if fields.get("READY") == "1":     # checked beside, so later datagrams keep their times
                threading.Thread(target=lambda: self.ready_checks.append(self.on_ready()), daemon=True).start()

    def times(self, key: str, value: str | None = None) -> list[float]:
        return [t for t, m in self.messages if key in m and (value is None or m[key] == value)]

    def statuses(self) -> list[str]:
        return [m["STATUS"] for _, m in self.messages if "STATUS" in m]

    def close(self) -> None:
        self.done = True
        self.thread.join(5)
        self.sock.close()


def every_connection_ready(server: TritondServer) -> list[object]:
    """Readiness on fresh connections, so that SO_REUSEPORT spreads them over every worker."""
    out: list[object] = []
    for _ in range(8):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=5)
        try:
            conn.request("GET", "/v2/health/ready")
            out.append(conn.getresponse().status)
        except OSError as e:
            out.append(e)
        finally:
            conn.close()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            out.append(client.is_server_ready())
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            out.append(e)
        finally:
            client.close()
    return out


def test_ready_watchdog_hung_broker_and_stopping(example_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "identity_fp32", repo / "identity_fp32")
    holder: dict[str, TritondServer] = {}
    notify = NotifySocket(tmp_path / "notify", lambda: every_connection_ready(holder["s"]))
    s = TritondServer(repo, ["--http-workers", "2", "--grpc-workers", "2",
                             f"--broker-hang-timeout-secs={HANG_S:g}"],
                      env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "2000000"})
    holder["s"] = s
    try:
        with serving(s):
            wait_for(lambda: notify.ready_checks, 30, "READY=1", every=0.05)
            # READY=1 came only once every HTTP and gRPC worker answers ready.
            assert notify.ready_checks == [[200, True] * 8], notify.ready_checks
            assert notify.statuses()[0] == "loading models", notify.statuses()
            [ready] = [m for _, m in notify.messages if m.get("READY") == "1"]
            assert ready["STATUS"].startswith("serving 1 model versions; HTTPService 127.0.0.1:"), ready

            ready_at = notify.times("READY", "1")[0]

            def pets_after_ready() -> list[float] | None:     # every 1 s (half of WatchdogSec=2s)
                pets = [t for t in notify.times("WATCHDOG", "1") if t > ready_at]
                return pets if len(pets) >= 4 else None
            pets = wait_for(pets_after_ready, 15, lambda: f"four watchdog pets after READY=1: {notify.messages}")
            # systemd restarts a service silent for WatchdogSec; a pet every half of it leaves
            # the other half for a busy host to schedule the supervisor late.
            gaps = [b - a for a, b in zip(pets, pets[1:])]
            assert 0.5 < min(gaps) and max(gaps) < 1.7, gaps

            # A hung (stopped, not dead) broker: the watchdog goes quiet, the supervisor kills it
            # after the hang timeout and starts a new one; then the pets resume.
            [broker] = s.role_pids("tritond.broker.main")
            stopped_at = time.monotonic()
            os.kill(broker, signal.SIGSTOP)
            wait_for(lambda: s.role_pids("tritond.broker.main") not in ([], [broker]) and "the broker is back" in s.log,
                     60, lambda: "a new broker:\n" + s.log)
            assert "sent nothing for" in s.log and "it is hung; killing it" in s.log, s.log
            assert "the broker is hung; restarting it" in notify.statuses()
            # Not healthy after 3 s of silence (as the frontends judge it); killed HANG_S after its
            # last ping, which came at most 0.5 s before it stopped.
            quiet = [t for t in notify.times("WATCHDOG", "1") if stopped_at + 3.1 < t < stopped_at + HANG_S - 0.6]
            assert not quiet, "WATCHDOG=1 was sent while the broker was hung: " + str(
                [round(t - stopped_at, 2) for t in notify.times("WATCHDOG", "1")])
            back_at = time.monotonic()
            wait_for(lambda: [t for t in notify.times("WATCHDOG", "1") if t > back_at], 30, "the watchdog to resume")

            code = s.stop()
            assert code == 0, s.log
            assert notify.times("STOPPING", "1"), notify.messages
            assert "draining in-flight requests" in notify.statuses()
    finally:
        notify.close()
