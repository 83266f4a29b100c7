"""`tritond analyze` against real servers, on a tiny sweep of the bundled ONNX MLP with short
windows: every trial's config is applied (seen through the model config API while the sweep
runs), the model's own config comes back at the end, the winning config meets the latency
limit when measured again, the report renders in headless Chromium with its plots, and
Ctrl-C on an analyze that started its own server still writes the report and stops it.

The screenshot goes to $TRITOND_TEST_ARTIFACTS (default test-artifacts/ in the checkout).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format

from conftest import ROOT, TritondServer, serving, session_pids
from tritond.analyze.space import Candidate, from_config
from tritond.repository.render import ModelConfig

LIMIT_MS = 250          # generous: the rerun must meet it on a loaded CI host
SWEEP = ["--max-latency-ms", str(LIMIT_MS), "--instances", "1,2", "--dynamic-batching", "both",
         "--queue-delays-us", "300", "--preferred-batch-sizes", "0", "--max-batch-sizes", "64", "--thread-counts", "0",
         "--concurrency", "1,2", "-p", "200", "-r", "3", "-s", "1000"]
ARTIFACTS = Path(os.environ.get("TRITOND_TEST_ARTIFACTS", ROOT / "test-artifacts"))


def analyze(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tritond.cli", "analyze", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw)


class ConfigWatcher(threading.Thread):
    """Reads the model's config through the config API every 20 ms and keeps every distinct one."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self.client = httpclient.InferenceServerClient(url)
        self.model = model
        self.seen: list[Candidate] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                c = from_config(self.client.get_model_config(self.model))
            except Exception:  # the model is between two loads
                c = None
            if c is not None and (not self.seen or self.seen[-1] != c):
                self.seen.append(c)
            time.sleep(0.02)


@pytest.fixture(scope="module")
def mlp_repo(example_repo, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("analyze") / "models"
    shutil.copytree(Path(example_repo) / "mlp_onnx", repo / "mlp_onnx")
    return repo


@pytest.fixture(scope="module")
def explicit_server(mlp_repo):
    with serving(TritondServer(mlp_repo, ["--model-control-mode=explicit", "--load-model=mlp_onnx"])) as s:
        yield s


@pytest.fixture(scope="module")
def sweep_run(explicit_server, mlp_repo, tmp_path_factory):
    """One analyze over the running server, its config API watched throughout."""
    out = tmp_path_factory.mktemp("analyze-out")
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    original = client.get_model_config("mlp_onnx")
    watcher = ConfigWatcher(explicit_server.http_url, "mlp_onnx")
    watcher.start()
    proc = analyze("-m", "mlp_onnx", "-u", explicit_server.http_url, "--repository", str(mlp_repo),
                   "--output-dir", str(out), *SWEEP)
    stdout, stderr = proc.communicate(timeout=240)
    watcher.done.set()
    watcher.join()
    assert proc.returncode == 0, stdout + stderr
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"out": out, "stdout": stdout, "stderr": stderr, "rows": rows, "seen": watcher.seen,
            "original": original, "final": client.get_model_config("mlp_onnx")}


def candidate_of(row: dict, prefix: str = "") -> Candidate:
    g = lambda k: row[prefix + k]  # noqa: E731
    return Candidate(int(g("instances")), int(g("max_batch_size")), g("dynamic_batching") == "True",
                     int(g("max_queue_delay_us") or 0),
                     tuple(int(x) for x in g("preferred_batch_size").split("/") if x),
                     int(g("intra_op_thread_count") or 0)).normalized()


def test_every_trial_config_is_applied(sweep_run):
    rows = sweep_run["rows"]
    trials = {int(r["trial"]): candidate_of(r) for r in rows}
    assert len(trials) >= 3, sweep_run["stderr"]
    assert trials[0] == from_config(sweep_run["original"]), "trial 0 is the model's own config"
    for r in rows:
        assert candidate_of(r, "server_") == candidate_of(r), f"the config API showed something else: {r}"
        assert r["problems"] == "", r
    for trial, c in trials.items():
        assert c in sweep_run["seen"], f"trial {trial} ({c.label()}) never appeared in the config API"
    assert {c.instances for c in trials.values()} == {1, 2}
    assert {c.dynamic for c in trials.values()} == {True, False}
    assert sweep_run["final"] == sweep_run["original"], "the model's own config is loaded back at the end"


def test_trial_rows_carry_server_side_figures(sweep_run):
    search = [r for r in sweep_run["rows"] if r["phase"] == "search"]
    assert {int(r["concurrency"]) for r in search} <= {1, 2}
    for r in search:
        assert float(r["infer_per_sec"]) > 0 and float(r["p99_ms"]) >= float(r["p50_ms"]) > 0
        hist = dict(item.split(":") for item in r["batch_sizes"].split(";"))
        assert sum(map(int, hist.values())) > 0 and max(map(int, hist)) <= int(r["concurrency"])
        assert float(r["avg_batch_size"]) >= 1 and int(r["server_compute_infer_us"]) > 0
        assert r["feasible"] == str(float(r["p99_ms"]) <= LIMIT_MS)
    assert any(r["phase"] == "rerun" for r in sweep_run["rows"]), "the winner is measured again"


def test_winner_meets_the_limit_on_a_rerun(sweep_run, explicit_server, mlp_repo, tmp_path):
    m = re.search(r"winner: #(\d+) .* at concurrency (\d+)", sweep_run["stdout"])
    assert m, sweep_run["stdout"]
    trial, concurrency = int(m.group(1)), m.group(2)
    written = mlp_repo / "mlp_onnx" / "configs" / "analyzed.pbtxt"
    cfg = text_format.Parse(written.read_text(), ModelConfig())
    winner = next(candidate_of(r) for r in sweep_run["rows"] if int(r["trial"]) == trial)
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        client.load_model("mlp_onnx", config=json.dumps(json_format.MessageToDict(cfg, preserving_proto_field_name=True)))
        assert from_config(client.get_model_config("mlp_onnx")) == winner
        out = tmp_path / "rerun.csv"
        proc = subprocess.run([sys.executable, "-m", "tritond.cli", "perf", "-m", "mlp_onnx", "--engine", "python",
                               "-u", explicit_server.http_url, "--concurrency-range", concurrency,
                               "--percentile", "99", "-p", "500", "-s", "1000", "-r", "3", "-f", str(out)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with open(out, newline="") as f:
            [row] = list(csv.DictReader(f))
        assert int(row["p99 latency"]) / 1000 <= LIMIT_MS, row
    finally:
        client.load_model("mlp_onnx", config=json.dumps(sweep_run["original"]))


class _Elements(HTMLParser):
    """Element ids in a DOM dump, each with the ids of its ancestors."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.paths: list[tuple[str, ...]] = []

    def handle_starttag(self, tag, attrs):
        self.stack.append((tag, dict(attrs).get("id")))
        self.paths.append(tuple(f"{t}#{i}" if i else t for t, i in self.stack))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (scripts/setup.sh --test installs it as root)")
def test_report_renders_in_headless_chromium(sweep_run, tmp_path):
    report = sweep_run["out"] / "report.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "analyze-report.png"
    flags = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2400"]
    dom = subprocess.run(flags + ["--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    subprocess.run(flags + [f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120, check=True)
    elements = _Elements()
    elements.feed(dom.stdout)
    paths = elements.paths

    def inside(figure: str, tag: str) -> int:
        return sum(1 for p in paths if f"figure#{figure}" in p and (p[-1] == tag or p[-1].startswith(tag + "#")))

    for figure in ("pareto", "batch-histogram", "latency-breakdown"):
        assert inside(figure, "svg") == 1, f"figure {figure} has no rendered SVG"
        assert inside(figure, "path") >= 5, f"figure {figure} draws nothing"
    assert any("g#pareto-front" in p for p in paths) and any("g#winner-marker" in p for p in paths)
    assert sum(1 for p in paths if "table#top-configs" in p and p[-1] == "tr") >= 3
    assert any(p[-1] == "div#winner" for p in paths) and any(p[-1] == "ul#why" for p in paths)
    from PIL import Image
    with Image.open(shot) as img:
        assert img.size == (1280, 2400)
        colours = img.convert("RGB").resize((128, 240)).getcolors(1 << 16)
        assert colours is not None and len(colours) > 50, "the screenshot is blank"


def test_ctrl_c_still_writes_the_report_and_stops_its_server(mlp_repo, tmp_path):
    """Analyze starts its own server (no -u); SIGINT after the first trial."""
    out = tmp_path / "out"
    # Ctrl-C as at a terminal, also when the test run itself was started in the background
    # (a non-interactive shell starts background jobs with SIGINT ignored, and children inherit it)
    proc = analyze("-m", "mlp_onnx", "--repository", str(mlp_repo), "--output-dir", str(out),
                   "--memory-budget-mb", "100000", "--config-out", str(tmp_path / "cfg"),
                   "--instances", "1,2,3", "--dynamic-batching", "on", "--concurrency", "1,2",
                   "-p", "300", "-r", "3", "-s", "1000",
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("trial 1:"):
            break
    else:
        proc.wait()
        pytest.fail("analyze never reached its second trial:\n" + "".join(lines))
    # its tritond is its child, leading a session of its own
    children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    server_sid = children[0] if children else None
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert (out / "report.html").is_file() and "Interrupted" in (out / "report.html").read_text()
    with open(out / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and rows[0]["trial"] == "0" and rows[0]["memory_mb"] and float(rows[0]["memory_mb"]) > 0
    assert server_sid is not None and session_pids(server_sid) == [], "its tritond is still running"
    server_id = re.search(r"server id ([0-9a-f]{32})", (out / "server.log").read_text()).group(1)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"tritond.{server_id}.")]


@pytest.mark.parametrize("args,message", [
    (["-m", "mlp_onnx"], "give --repository DIR"),
    (["-m", "mlp_onnx", "-u", "127.0.0.1:1", "--memory-budget-mb", "100"], "needs the server that tritond analyze"),
    (["-m", "mlp_onnx", "-u", "127.0.0.1:1", "--max-latency-ms", "-1"], "--max-latency-ms must be positive"),
    (["-m", "mlp_onnx", "-u", "127.0.0.1:1", "-r", "2"], "--max-trials must be at least 3"),
    (["-m", "nope", "--repository", "/nonexistent"], "is not a model directory"),
])
def test_usage_errors_are_refused_before_any_work(args, message, capsys):
    from tritond.analyze.cli import main
    assert main(args) == 1
    assert message in capsys.readouterr().err


def test_unknown_model_on_a_running_server(explicit_server, tmp_path):
    proc = analyze("-m", "nope", "-u", explicit_server.http_url, "--output-dir", str(tmp_path))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "tritond analyze: error:" in stderr and "nope" in stderr, stderr
