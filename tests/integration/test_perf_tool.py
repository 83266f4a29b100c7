"""`tritond perf` against a real server: perf_analyzer's CSV columns with values that agree
with the server's statistics, the real perf_analyzer giving the same columns, gRPC with
system shared memory and a Poisson request rate from a JSON data file, and perf_analyzer's
stability rule. Short windows with a loose stability threshold keep it quick: these check
what is measured and written, not how fast the server is."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from conftest import ROOT, TritondServer, serving

PA_COLUMNS = ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
              "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
              "p50 latency", "p90 latency", "p95 latency", "p99 latency"]
WINDOW_MS = 300
FAST = ["-p", str(WINDOW_MS), "-s", "1000", "-r", "3"]    # 3 windows: stable by construction


def perf_analyzer() -> str | None:
    found = shutil.which("perf_analyzer")
    local = ROOT / ".venv" / "perf_analyzer" / "perf_analyzer"
    return found or (str(local) if os.access(local, os.X_OK) else None)


@pytest.fixture(scope="module")
def perf_server(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("perf") / "models"
    shutil.copytree(Path(example_repo) / "mlp_onnx", repo / "mlp_onnx")
    with serving(TritondServer(repo, ["--allow-client-shm=true"])) as s:
        yield s


def tritond_perf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if perf_analyzer():
        env["PATH"] = f"{Path(perf_analyzer()).parent}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "tritond.cli", "perf", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def success_count(client: httpclient.InferenceServerClient) -> tuple[int, int, int]:
    s = client.get_inference_statistics("mlp_onnx")["model_stats"][0]
    infer = s["inference_stats"]["compute_infer"]
    return s["inference_stats"]["success"]["count"], infer["count"], infer["ns"]


def test_csv_columns_and_values_against_the_server(perf_server, tmp_path):
    client = httpclient.InferenceServerClient(perf_server.http_url)
    before = success_count(client)
    out = tmp_path / "ours.csv"
    proc = tritond_perf("-m", "mlp_onnx", "-u", perf_server.http_url, "--engine", "python",
                        "--concurrency-range", "1:2", *FAST, "-f", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = success_count(client)
    header, rows = read_csv(out)
    assert header == PA_COLUMNS
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 2]
    ips = [float(r["Inferences/Second"]) for r in rows]
    assert ips == sorted(ips), "rows in increasing throughput, as perf_analyzer writes them"
    for r in rows:
        lat = [int(r[f"p{p} latency"]) for p in (50, 90, 95, 99)]
        assert 0 < lat[0] <= lat[1] <= lat[2] <= lat[3], r
        assert int(r["Server Compute Infer"]) > 0 and int(r["Server Queue"]) >= 0, r
        assert int(r["Client Send"]) >= 0 and int(r["Client Recv"]) >= 0, r
    # Every counted request is one the server answered; the windows cover nearly all sent.
    measured = sum(x * 3 * WINDOW_MS / 1000 for x in ips)
    served = after[0] - before[0]
    assert 0.6 * served <= measured <= served + 2, (measured, served)
    # The server columns are the statistics API's own figures over the same requests.
    server_infer_us = (after[2] - before[2]) / (after[1] - before[1]) / 1000
    csv_infer_us = sum(int(r["Server Compute Infer"]) * x for r, x in zip(rows, ips)) / sum(ips)
    assert 0.5 * server_infer_us <= csv_infer_us + 1 <= 2 * server_infer_us + 2, (csv_infer_us, server_infer_us)
    assert "Concurrency: 1, throughput:" in proc.stdout


@pytest.mark.skipif(perf_analyzer() is None, reason="perf_analyzer is not installed")
def test_real_perf_analyzer_writes_the_same_columns(perf_server, tmp_path):
    for engine, extra in (("perf_analyzer", []), ("python", []), ("perf_analyzer", ["--percentile", "85",
                                                                                      "--verbose-csv"]),
                          ("python", ["--percentile", "85", "--verbose-csv"])):
        out = tmp_path / f"{engine}{len(extra)}.csv"
        proc = tritond_perf("-m", "mlp_onnx", "-u", perf_server.http_url, "--engine", engine,
                            "--concurrency-range", "2", *FAST, "-f", str(out), *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert ("Engine: tritond" in proc.stdout) == (engine == "python")
        header, rows = read_csv(out)
        if extra:
            assert header == PA_COLUMNS[:10] + ["p85 latency"] + PA_COLUMNS[10:] + ["request/response",
                                                                                      "response wait"]
        else:
            assert header == PA_COLUMNS
        assert len(rows) == 1 and float(rows[0]["Inferences/Second"]) > 0


ENGINES = ["python"] + (["perf_analyzer"] if perf_analyzer() else [])


@pytest.mark.parametrize("engine", ENGINES)
def test_grpc_shared_memory_poisson_rate_from_a_data_file(perf_server, tmp_path, engine):
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": [0.5] * 256}, {"INPUT0": {"content": [1.0] * 256,
                                                                               "shape": [256]}}]}))
    client = httpclient.InferenceServerClient(perf_server.http_url)
    out = tmp_path / "rate.csv"
    proc = tritond_perf("-m", "mlp_onnx", "-u", perf_server.grpc_url, "-i", "grpc", "--shared-memory", "system",
                        "--engine", engine,
                        "--request-rate-range", "40:80:40", "--request-distribution", "poisson",
                        "--input-data", str(data), "-p", "500", "-s", "1000", "-r", "3", "-f", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, rows = read_csv(out)
    assert header[0] == "Request Rate" and header[1:] == PA_COLUMNS[1:]
    for r in rows:
        rate = float(r["Request Rate"])
        assert rate in (40, 80)
        assert 0.4 * rate <= float(r["Inferences/Second"]) <= 1.8 * rate, r
    assert client.get_system_shared_memory_status() == [], "regions unregistered"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("tritond_perf_")], "regions left behind"


def test_unstable_levels_and_bad_models_fail_like_perf_analyzer(perf_server, tmp_path):
    out = tmp_path / "unstable.csv"
    proc = tritond_perf("-m", "mlp_onnx", "-u", perf_server.http_url, "--engine", "python",
                        "--concurrency-range", "1:2", "-p", "100", "-s", "0.0001", "-r", "3", "-f", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Failed to obtain stable measurement within 3 measurement windows for concurrency 1" in proc.stderr
    # The unstable level's figures are still the result: reported, written, and said to be unstable.
    header, rows = read_csv(out)
    assert header == PA_COLUMNS and [r["Concurrency"] for r in rows] == ["1"], "the sweep ends at an unstable level"
    assert float(rows[0]["Inferences/Second"]) > 0
    assert "Concurrency: 1, throughput: " in proc.stdout and "usec (unstable)" in proc.stdout
    assert f"Note: concurrency 1 is unstable: its figures in {out}" in proc.stderr
    proc = tritond_perf("-m", "nope", "-u", perf_server.http_url, "--engine", "python")
    assert proc.returncode == 1 and "tritond perf: error:" in proc.stderr and "nope" in proc.stderr
    proc = tritond_perf("-m", "mlp_onnx", "--concurrency-range", "4:2")
    assert proc.returncode == 1 and "end is below start" in proc.stderr


@pytest.mark.skipif(perf_analyzer() is None, reason="perf_analyzer is not installed (scripts/install-perf-analyzer)")
def test_when_perf_analyzer_finds_nothing_stable_the_engine_still_gives_a_result(perf_server, tmp_path):
    out = tmp_path / "unstable.csv"
    proc = tritond_perf("-m", "mlp_onnx", "-u", perf_server.http_url, "--concurrency-range", "1",
                        "-p", "100", "-s", "0.0001", "-r", "3", "-f", str(out))
    assert "perf_analyzer found no stable level and wrote nothing; measuring again" in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    header, rows = read_csv(out)
    assert header == PA_COLUMNS and [r["Concurrency"] for r in rows] == ["1"]
    assert f"Note: concurrency 1 is unstable: its figures in {out}" in proc.stderr
