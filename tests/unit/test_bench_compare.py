"""perf/bench_compare.py's pure parts: arguments, ratios, the table, the base revision's layout."""
import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "perf"))

import anchors  # noqa: E402
import bench_compare as bc  # noqa: E402


def window(us_by_key: dict[tuple[str, str], float], requests: int = 1000) -> bc.Window:
    """A window whose CPU works out to the given µs per request by (role, thread kind)."""
    return bc.Window(requests, 3.0, {k: v * requests / 1e6 for k, v in us_by_key.items()})


def flat(us: float) -> bc.Window:
    return window({("worker", "main"): us})


# ---------------------------------------------------------------- arguments

def test_defaults():
    args = bc.parse_args([])
    assert (args.rounds, args.window, args.warmup) == (3, 5.0, 1.0)
    assert args.cases == ["http-json-c1", "http-json-c16", "http-binary-c16", "grpc-c16"]
    assert args.base is None and args.no_triton is False


def test_options():
    args = bc.parse_args(["--rounds", "2", "--window", "3", "--cases", "grpc-c16,http-json-c1,grpc-c16",
                          "--base", "b280652", "--no-triton", "--anchors-dir", "/x"])
    assert (args.rounds, args.window) == (2, 3.0)
    assert args.cases == ["grpc-c16", "http-json-c1"]      # order kept, repeats dropped
    assert args.base == "b280652" and args.no_triton and args.anchors_dir == Path("/x")


@pytest.mark.parametrize("argv", [["--cases", "grpc"], ["--cases", ","], ["--rounds", "0"], ["--window", "-1"],
                                  ["--rounds", "two"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        bc.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_cases_are_the_briefed_loads():
    loads = {name: (load.case.protocol, load.case.binary, load.concurrency, load.case.model, load.case.shape)
             for name, load in bc.LOADS.items()}
    assert loads == {"http-json-c1": ("http", False, 1, "identity_fp32", (16,)),
                     "http-json-c16": ("http", False, 16, "identity_fp32", (16,)),
                     "http-binary-c16": ("http", True, 16, "identity_fp32", (16,)),
                     "grpc-c16": ("grpc", True, 16, "identity_fp32", (16,))}


# ---------------------------------------------------------------- ratios and cells

def test_ratios_pair_rounds_and_skip_empty_windows():
    assert bc.ratios([300, 320], [100, 80]) == [3.0, 4.0]
    assert bc.ratios([300, float("nan"), 200], [100, 100, 0]) == [3.0]
    assert bc.median_ratio([300, 320, 330], [100, 80, 100]) == "3.30"
    assert bc.median_ratio([300, 320], [100, 80]) == "3.50"
    assert bc.median_ratio([float("nan")], [100]) == "-"


def test_span():
    assert bc.span([612.4, 640.6, 633]) == "612–641"
    assert bc.span([61.2, 60.8]) == "61"
    assert bc.span([float("nan")]) == "-" and bc.span([]) == "-"


def test_us_per_request():
    w = bc.Window(2000, 3.0, {("broker", "main"): 0.5, ("broker", "zmq I/O"): 0.3})
    assert w.us_per_request == pytest.approx(400)
    assert math.isnan(bc.Window(0, 3.0, {("broker", "main"): 0.5}).us_per_request)


def test_by_process_counts_zmq_threads_apart():
    w = window({("http frontend", "main"): 200, ("http frontend", "zmq I/O"): 30, ("broker", "main"): 100,
                ("broker", "zmq I/O"): 50, ("worker", "main"): 60, ("worker", "other"): 5})
    assert bc.by_process(w) == pytest.approx({"http frontend": 200, "broker": 100, "worker": 65, "zmq I/O": 80})


def test_breakdown_orders_the_request_path_first_and_takes_medians():
    rounds = [window({("supervisor", "main"): 3, ("worker", "main"): 60, ("grpc frontend", "main"): 400,
                      ("broker", "main"): 150, ("broker", "zmq I/O"): 120, ("template", "main"): 0.2,
                      ("gone", "main"): 9}),
              window({("supervisor", "main"): 1, ("worker", "main"): 80, ("grpc frontend", "main"): 420,
                      ("broker", "main"): 170, ("broker", "zmq I/O"): 100})]
    assert bc.breakdown(rounds) == "grpc frontend 410 · broker 160 · worker 70 · zmq I/O 110 · supervisor 2"
    assert bc.breakdown([]) == "-"


def test_rotated():
    assert [bc.rotated("ABC", r) for r in range(4)] == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]


# ---------------------------------------------------------------- the table

def results(names, us):
    return {(case, server): [flat(v) for v in values] for case in names for server, values in us.items()}


def test_render_with_triton():
    table = bc.render(results(["http-json-c1", "grpc-c16"], {"Triton": [200, 250], "base": [900, 1000],
                                                              "head": [800, 1000]}),
                      ["http-json-c1", "grpc-c16"], ["Triton", "base", "head"]).splitlines()
    assert table[0] == ("| case | Triton µs/req | base µs/req | head µs/req | base / Triton | head / Triton "
                        "| head / base | base by process, µs/req | head by process, µs/req |")
    assert table[1] == "|---|---:|---:|---:|---:|---:|---:|---|---|"
    # per-round ratios: base 4.5, 4.0 -> 4.25; head 4.0, 4.0; head/base 0.889, 1.0 -> 0.94
    assert table[2] == "| HTTP JSON, c=1 | 200–250 | 900–1000 | 800–1000 | 4.25 | 4.00 | 0.94 | worker 950 | worker 900 |"
    assert table[3].startswith("| gRPC, c=16 | ")
    assert len(table) == 4


def test_render_without_triton():
    table = bc.render(results(["http-binary-c16"], {"base": [600], "head": [450]}),
                      ["http-binary-c16"], ["base", "head"]).splitlines()
    assert table[0] == ("| case | base µs/req | head µs/req | head / base | base by process, µs/req "
                        "| head by process, µs/req |")
    assert table[1] == "|---|---:|---:|---:|---|---|"
    assert table[2] == "| HTTP binary, c=16 | 600 | 450 | 0.75 | worker 600 | worker 450 |"


def test_render_marks_missing_windows():
    table = bc.render({}, ["grpc-c16"], ["base", "head"]).splitlines()
    assert table[2] == "| gRPC, c=16 | - | - | - | - | - |"


# ---------------------------------------------------------------- revisions and layout

def test_default_base():
    def git(answers):
        def run(*args):
            answer = answers[args[0]]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return run

    assert bc.default_base(git({"rev-parse": "h", "merge-base": "m"})) == "m"
    assert bc.default_base(git({"rev-parse": "h", "merge-base": "h"})) == "HEAD~1"
    assert bc.default_base(git({"rev-parse": "h", "merge-base": subprocess.CalledProcessError(1, "git")})) == "HEAD~1"


def test_package_links():
    cfg = """[metadata]
name = tritond
[options]
package_dir =
    tritond = tritond
    tritond.broker = broker
    tritond.broker.tables = broker/tables
    tritond.frontend.http = frontend/http
    tritond.wire = wire/
    tritond.perf = tritond/perf
packages =
    tritond
"""
    assert bc.package_links(cfg) == {"broker": "broker", "wire": "wire"}
    assert bc.package_links("[options]\npackages = tritond\n") == {}


def test_harness_pins():
    text = "PYTRITON_VER=0.7.0            # bundles\nTRITONCLIENT_VER=2.73.0\nORT_VER=1.32.0\nUVLOOP_VER=0.21.0\n" \
           "NUMPY_TRITON_VER=1.26.4      # pytriton wants numpy<2\nNUMPY_MLSERVER_VER=2.4.6\n"
    assert anchors.harness_pins(text) == ["nvidia-pytriton==0.7.0", "tritonclient[all]==2.73.0", "onnxruntime==1.32.0",
                                          "uvloop==0.21.0", "numpy==1.26.4"]
    with pytest.raises(anchors.AnchorsError, match="ORT_VER"):
        anchors.harness_pins(text.replace("ORT_VER", "ORT_VERSION"))


@pytest.mark.skipif(not anchors.HARNESS.is_file(), reason="no ../shared/bench-anchors beside the checkout")
def test_harness_still_sets_the_pins():
    assert len(anchors.harness_pins(anchors.HARNESS.read_text())) == len(anchors.TRITON_VENV_PINS)
