"""deploy/systemd/tritond.service: systemd accepts it, and its timeouts fit tritond's."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritond.options import server_options, start_parser

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "tritond.service"


def service_section() -> dict[str, str]:
    out: dict[str, str] = {}
    section = ""
    text = UNIT.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def seconds(value: str) -> float:
    return float(value[:-3]) * 60 if value.endswith("min") else float(value.rstrip("s"))


def test_unit_fits_tritond():
    s = service_section()
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert s["KillMode"] == "mixed"              # SIGTERM to the supervisor only: it drains
    argv = shlex.split(s["ExecStart"])
    assert argv[0].endswith("/tritond") and argv[1] == "start"
    opts = server_options(start_parser().parse_args(argv[2:]))
    assert seconds(s["TimeoutStopSec"]) > opts.exit_timeout_secs + 5
    # The supervisor restarts a hung broker before systemd's watchdog restarts everything.
    assert seconds(s["WatchdogSec"]) > opts.broker_hang_timeout_secs
    assert seconds(s["TimeoutStartSec"]) >= 600
    assert s["Environment"] == "TRITOND_MODEL_CACHE_DIR=/var/cache/tritond" and s["CacheDirectory"] == "tritond"


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("SKIP reason: systemd-analyze is not installed")
        pytest.skip("systemd-analyze is not installed")
    tritond = Path(sys.executable).parent / "tritond"
    unit = tmp_path / "tritond.service"
    unit.write_text(UNIT.read_text().replace("/opt/tritond/.venv/bin/tritond", str(tritond)))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
