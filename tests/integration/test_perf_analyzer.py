"""NVIDIA's perf_analyzer against tritond: HTTP, gRPC and `--shared-memory system`, on the
bundled models. It reads the model metadata and config, registers and unregisters its own
shared-memory regions, and reads server-side statistics; each run must finish and report a
positive throughput, and leave no region behind.

perf_analyzer is found on PATH or in `.venv/perf_analyzer/` (where `scripts/setup.sh --test`
installs it); the test skips with the reason when it is absent.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, TritondServer, serving

MODELS = ["identity_fp32", "identity_dyn", "add_sub_onnx", "string_upper"]
THROUGHPUT = re.compile(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec")


def perf_analyzer() -> str | None:
    found = shutil.which("perf_analyzer")
    if found:
        return found
    local = ROOT / ".venv" / "perf_analyzer" / "perf_analyzer"
    return str(local) if os.access(local, os.X_OK) else None


pytestmark = pytest.mark.skipif(
    perf_analyzer() is None,
    reason="perf_analyzer is not installed (bash scripts/install-perf-analyzer .venv/perf_analyzer)")


@pytest.fixture(scope="module")
def pa_server(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("pa") / "models"
    for name in MODELS:
        shutil.copytree(Path(example_repo) / name, repo / name)
    with serving(TritondServer(repo, ["--allow-client-shm=true"], grpc=True)) as s:
        yield s


def client_regions() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if not n.startswith("tritond.")}


RUNS = [
    ("identity_fp32", "http", "none", 1, ["--shape", "INPUT0:64"]),
    ("identity_fp32", "grpc", "none", 2, ["--shape", "INPUT0:64"]),
    ("identity_fp32", "http", "system", 2, ["--shape", "INPUT0:64"]),
    ("identity_fp32", "grpc", "system", 1, ["--shape", "INPUT0:64"]),
    ("identity_dyn", "grpc", "system", 2, ["--shape", "INPUT0:16", "-b", "4"]),
    ("add_sub_onnx", "http", "system", 2, ["-b", "2"]),
    ("add_sub_onnx", "grpc", "none", 1, []),
    ("string_upper", "http", "system", 1, ["--shape", "INPUT0:4", "--output-shared-memory-size", "4096"]),
]


@pytest.mark.parametrize("model,protocol,memory,concurrency,extra", RUNS,
                         ids=[f"{m}-{p}-{s}-c{c}" for m, p, s, c, _ in RUNS])
def test_perf_analyzer_completes(pa_server, model, protocol, memory, concurrency, extra):
    """One measurement of a fixed request count: a shared, noisy host never lets a
    time-window measurement look stable, and stability is not what this checks."""
    url = pa_server.http_url if protocol == "http" else pa_server.grpc_url
    before = client_regions()
    cmd = [perf_analyzer(), "-m", model, "-u", url, "-i", protocol, "--shared-memory", memory,
           "--concurrency-range", str(concurrency), "--request-count", "200", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = {int(c): float(t) for c, t in THROUGHPUT.findall(out)}
    assert list(found) == [concurrency], out
    assert found[concurrency] > 0, out
    assert client_regions() <= before, "perf_analyzer left shared-memory regions behind"
    assert pa_server.proc.poll() is None
