"""The command line a new user meets first: --version, a mistyped flag, and `start --help`."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tritond.frontend.metadata import SERVER_VERSION
from tritond.options import start_parser
from tritond.start_help import GROUPS


def tritond(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tritond.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_version_and_exits_0(flag):
    out = tritond(flag)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tritond ") and SERVER_VERSION in out.stdout and not out.stderr


@pytest.mark.parametrize("args", [["--model-repository", "/nonexistent", "--http-prot", "8000"],
                                  ["start", "--http-prot=8000"]])
def test_a_mistyped_flag_is_one_line_naming_the_closest_flag(args):
    out = tritond(*args)
    assert out.returncode == 1 and not out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "'--http-prot'" in lines[0] and "did you mean '--http-port'?" in lines[0] and "--help" in lines[0]


def _options() -> list[argparse.Action]:
    return [a for a in start_parser()._actions if a.option_strings and a.dest != "help"]


def test_every_flag_has_help_and_the_help_gives_its_default():
    text = start_parser().format_help()
    for action in _options():
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
        shown = start_parser().formatter_class("tritond start")._get_help_string(action)
        if action.default not in (None, []):
            assert "default" in shown, action.option_strings
        assert action.option_strings[0] in text


def test_help_groups_the_flags_as_tritonserver_does():
    groups = {g.title: [s for a in g._group_actions for s in a.option_strings]
              for g in start_parser()._action_groups}
    titles = [t for t in groups if t not in ("positional arguments", "options")]
    assert titles == [title for title, _ in GROUPS]
    assert titles[:5] == ["Server", "Logging", "Model Repository", "HTTP", "GRPC"]
    assert "--http-port" in groups["HTTP"] and "--grpc-port" in groups["GRPC"]
    assert "--log-verbose" in groups["Logging"] and "--allow-client-shm" in groups["Shared Memory"]
    assert "--exit-timeout-secs" in groups["Server"] and "--model-control-mode" in groups["Model Repository"]


def test_count_flags_have_a_count_metavar():
    metavars = {a.option_strings[0]: a.metavar for a in _options()}
    assert metavars["--grpc-http2-max-pings-without-data"] == "COUNT"
    assert metavars["--grpc-http2-max-ping-strikes"] == "COUNT"
    assert metavars["--grpc-keepalive-time"] == "MS"
