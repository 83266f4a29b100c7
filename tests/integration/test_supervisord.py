"""tritond under supervisord, with the example program section from examples/supervisord:
supervisorctl stops it (drained, nothing left behind) and starts it again."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, free_port, http_get, session_pids, wait_for

pytest.importorskip("supervisor", reason="supervisord (PyPI 'supervisor') is not installed")

EXAMPLE = ROOT / "examples" / "supervisord" / "tritond.conf"


def program_section(repo: Path, log: Path, ports: tuple[int, int, int]) -> str:
    """The example's [program:tritond] with this test's command line and log path."""
    command = (f"{sys.executable} -m tritond.cli start --model-repository {repo} --http-port {ports[0]} "
               f"--grpc-port {ports[1]} --metrics-port {ports[2]} --exit-timeout-secs 10")
    text = EXAMPLE.read_text()
    text = re.sub(r"(?m)^command=.*$", lambda _: f"command={command}", text)
    text = re.sub(r"(?m)^stdout_logfile=.*$", lambda _: f"stdout_logfile={log}", text)
    text = re.sub(r"(?m)^startsecs=.*$", "startsecs=1", text)
    return text + f"directory={ROOT}\n"


def write_conf(tmp: Path, repo: Path, ports: tuple[int, int, int]) -> Path:
    conf = tmp / "supervisord.conf"
    conf.write_text(f"""
[unix_http_server]
file={tmp}/supervisor.sock

[supervisord]
logfile={tmp}/supervisord.log
pidfile={tmp}/supervisord.pid
childlogdir={tmp}
nodaemon=true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{tmp}/supervisor.sock

{program_section(repo, tmp / "tritond.log", ports)}
""")
    return conf


def ctl(conf: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(conf), *args],
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


def server_ids(log: Path) -> list[str]:
    return re.findall(r"server id ([0-9a-f]{32})", log.read_text()) if log.exists() else []


def assert_nothing_left(supervisord: subprocess.Popen, server_id: str) -> None:
    leftover = [p for p in session_pids(supervisord.pid) if p != supervisord.pid]
    assert not leftover, f"processes left behind: {leftover}"
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{server_id}.")]
    assert not segments, f"segments left behind: {segments}"


def test_supervisorctl_stops_and_starts_tritond(tmp_path, example_repo):
    ports = (free_port(), free_port(), free_port())
    conf = write_conf(tmp_path, example_repo, ports)
    log = tmp_path / "tritond.log"
    url = f"127.0.0.1:{ports[0]}"
    sup = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for round_ in range(2):
            if round_:
                assert "started" in ctl(conf, "start", "tritond")
            wait_for(lambda: http_get(f"http://{url}/v2/health/ready", 1.0)[0] == 200, 120, "tritond ready")
            client = httpclient.InferenceServerClient(url)
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
            np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), np.arange(4))
            client.close()
            assert "RUNNING" in ctl(conf, "status", "tritond")
            assert "stopped" in ctl(conf, "stop", "tritond")
            assert "STOPPED" in ctl(conf, "status", "tritond")
            assert len(server_ids(log)) == round_ + 1
            assert_nothing_left(sup, server_ids(log)[-1])
            assert "exit 0" in log.read_text().split("server id")[-1], log.read_text()
    finally:
        if sup.poll() is None:
            sup.send_signal(signal.SIGTERM)
            try:
                sup.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(sup.pid, signal.SIGKILL)
                sup.wait()
    for sid in server_ids(log):
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{sid}.")]
