"""Every benchmark under perf/ starts: its imports resolve and its `--help` answers (a script
whose imports broke would fail only when someone runs it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parents[2] / "perf"
SCRIPTS = sorted(p for p in PERF.glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_a_benchmark_answers_help(script: Path):
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=PERF, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
