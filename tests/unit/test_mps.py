"""MPS: the control daemon's commands and environment, the worker-side share check and the
--mps options. A stand-in `nvidia-cuda-mps-control` script records how it is called."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tritond import mps
from tritond.options import UsageError, server_options, start_parser
from tritond.wire.options import ServerOptions
from tritond.workers.gpu_env import check_mps_share


def test_worker_env_points_at_private_directories(tmp_path):
    d = mps.MpsDaemon(str(tmp_path), percentage=40)
    env = d.worker_env()
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
    }
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in mps.MpsDaemon(str(tmp_path)).worker_env()


def test_commands(tmp_path):
    d = mps.MpsDaemon(str(tmp_path), executable="/opt/bin/nvidia-cuda-mps-control")
    assert d.start_command() == ["/opt/bin/nvidia-cuda-mps-control", "-d"]
    assert d.quit_command() == (["/opt/bin/nvidia-cuda-mps-control"], "quit\n")
    env = d.control_env({"PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin", "CUDA_MPS_PIPE_DIRECTORY": d.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": d.log_dir}


def test_parse_percentage():
    assert mps.parse_percentage("25") == 25
    for bad in ("0", "101", "half", ""):
        with pytest.raises(ValueError, match="from 1 to 100"):
            mps.parse_percentage(bad)


def test_from_options(tmp_path):
    assert mps.from_options(ServerOptions(model_repositories=[], mps=False), str(tmp_path)) is None
    d = mps.from_options(ServerOptions(model_repositories=[], mps=True, mps_active_thread_percentage=50), str(tmp_path))
    assert d.percentage == 50 and d.pipe_dir.startswith(str(tmp_path))


def test_no_binary_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control was not found on PATH"):
        mps.MpsDaemon(str(tmp_path)).start()


def fake_control(tmp_path: Path, exit_code: int = 0) -> tuple[Path, Path]:
    """An executable that appends {argv, stdin, pipe dir} to a record file."""
    record = tmp_path / "calls.jsonl"
    exe = tmp_path / "bin" / "nvidia-cuda-mps-control"
    exe.parent.mkdir()
    exe.write_text(f"""#!{sys.executable}
import json, os, sys
stdin = "" if sys.argv[1:] == ["-d"] else sys.stdin.read()
with open({str(record)!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": stdin,
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
sys.stderr.write("daemon refused" if {exit_code} else "")
sys.exit({exit_code})
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, record


def test_no_gpu_is_a_clear_error(tmp_path, monkeypatch):
    exe, _ = fake_control(tmp_path)
    monkeypatch.setattr(mps, "gpu_count", lambda: 0)
    with pytest.raises(mps.MpsError, match="no GPU is visible"):
        mps.MpsDaemon(str(tmp_path / "run"), executable=str(exe)).start()


def test_start_and_stop_call_the_control_program(tmp_path, monkeypatch):
    exe, record = fake_control(tmp_path)
    monkeypatch.setattr(mps, "gpu_count", lambda: 1)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    d = mps.MpsDaemon(str(tmp_path / "run"))
    d.start()
    d.start()                                   # idempotent
    assert os.path.isdir(d.pipe_dir) and os.path.isdir(d.log_dir)
    assert stat.S_IMODE(os.stat(d.pipe_dir).st_mode) == 0o700
    d.stop()
    d.stop()                                    # idempotent
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls == [
        {"argv": ["-d"], "stdin": "", "pipe": d.pipe_dir, "log": d.log_dir},
        {"argv": [], "stdin": "quit\n", "pipe": d.pipe_dir, "log": d.log_dir},
    ]


def test_a_failing_daemon_reports_why(tmp_path, monkeypatch):
    exe, _ = fake_control(tmp_path, exit_code=1)
    monkeypatch.setattr(mps, "gpu_count", lambda: 1)
    with pytest.raises(mps.MpsError, match="-d failed: daemon refused"):
        mps.MpsDaemon(str(tmp_path / "run"), executable=str(exe)).start()


def test_worker_share_check():
    assert check_mps_share({}) is None
    assert check_mps_share({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}) == 30
    with pytest.raises(ValueError, match="mps_active_thread_percentage .* from 1 to 100, got 'lots'"):
        check_mps_share({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "lots"})


def test_options():
    base = ["--model-repository", "/tmp/x"]
    opts = server_options(start_parser().parse_args(base))
    assert opts.mps is False and opts.mps_active_thread_percentage is None
    opts = server_options(start_parser().parse_args(base + ["--mps", "--mps-active-thread-percentage", "60"]))
    assert opts.mps is True and opts.mps_active_thread_percentage == 60
    with pytest.raises(UsageError, match="from 1 to 100"):
        server_options(start_parser().parse_args(base + ["--mps-active-thread-percentage", "0"]))
