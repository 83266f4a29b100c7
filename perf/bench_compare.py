#!/usr/bin/env python3
"""CPU per request of real Triton, tritond at a base revision and tritond from the working tree.

One command starts the three servers at once on free loopback ports, all serving the example
repository's identity_fp32 (16 FP32, Python backend):

  Triton  tritonserver 2.51 of the nvidia-pytriton wheel (perf/anchors.py); a missing Triton
          folder is prepared as ../shared/bench-anchors/run_anchors.sh prepares it
  base    tritond at --base (default: the merge-base with main, or HEAD~1 when that is HEAD),
          checked out into a temporary git worktree and run from it (PYTHONPATH and working
          directory there)
  head    tritond from this working tree, uncommitted changes included

then measures bench_cpu's CPU time per request (user + system of every process and thread of
each server's tree, read from /proc, divided by the requests completed in the window) in
rounds: each round runs every case on every server in turn, the servers' order rotating from
round to round. The table gives each server's min-max over rounds, the medians of the
per-round ratios (each ratio compares windows of the same round) and base's and head's CPU by
process.

  python perf/bench_compare.py
  python perf/bench_compare.py --base b280652 --rounds 2 --window 3
  python perf/bench_compare.py --no-triton --cases http-json-c1,grpc-c16

Every server and the temporary worktree are removed on exit, Ctrl-C included.
"""
from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import bench_cpu
from anchors import AnchorsError, Triton, anchors_ready, prepare
from bench_core import READY_TIMEOUT_S, ROOT, Server, ServerStartError, build_repository

MODEL = "identity_fp32"


@dataclass(frozen=True)
class Load:
    case: bench_cpu.Case
    concurrency: int
    label: str


LOADS = {
    "http-json-c1": Load(bench_cpu.CASES["identity-http-json"], 1, "HTTP JSON, c=1"),
    "http-json-c16": Load(bench_cpu.CASES["identity-http-json"], 16, "HTTP JSON, c=16"),
    "http-binary-c16": Load(bench_cpu.CASES["identity-http-binary"], 16, "HTTP binary, c=16"),
    "grpc-c16": Load(bench_cpu.CASES["identity-grpc"], 16, "gRPC, c=16"),
}


@dataclass(frozen=True)
class Window:
    """One measured window of one server: requests completed and CPU seconds by (role, thread kind)."""

    requests: int
    seconds: float
    cpu: dict[tuple[str, str], float]

    @property
    def us_per_request(self) -> float:
        return sum(self.cpu.values()) / self.requests * 1e6 if self.requests else float("nan")


# ---------------------------------------------------------------- pure parts

def case_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown case {', '.join(unknown) or '(none)'}; cases: {', '.join(LOADS)}")
    return list(dict.fromkeys(names))


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=positive(int), default=3, help="rounds over every case and server (default 3)")
    p.add_argument("--window", type=positive(float), default=5.0, help="measured seconds per case, server and round")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each window")
    p.add_argument("--cases", type=case_list, default=list(LOADS), help=f"comma-separated, of: {', '.join(LOADS)}")
    p.add_argument("--base", help="git revision of the base tritond (default: merge-base with main, else HEAD~1)")
    p.add_argument("--no-triton", action="store_true", help="base vs head only (no Triton folder needed)")
    p.add_argument("--anchors-dir", type=Path, default=Path(os.environ.get("ANCHORS_DIR", "/tmp/anchors")),
                   help="the bench-anchors folder holding triton-venv and triton_dist (made when missing)")
    return p.parse_args(argv)


def ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-round ratios of two servers' figures (rounds pair up by position)."""
    return [a / b for a, b in zip(numerator, denominator) if math.isfinite(a) and math.isfinite(b) and b]


def span(values: Sequence[float]) -> str:
    good = [v for v in values if math.isfinite(v)]
    if not good:
        return "-"
    lo, hi = min(good), max(good)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}"


def median_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> str:
    r = ratios(numerator, denominator)
    return f"{statistics.median(r):.2f}" if r else "-"


GROUP_ORDER = ("http frontend", "grpc frontend", "broker", "worker", "zmq I/O")


def by_process(window: Window) -> dict[str, float]:
    """µs per request by process role, ZeroMQ's I/O threads (of every process) counted apart."""
    out: dict[str, float] = {}
    n = max(window.requests, 1)
    for (role, kind), seconds in window.cpu.items():
        group = "zmq I/O" if kind == "zmq I/O" else role
        out[group] = out.get(group, 0.0) + seconds / n * 1e6
    return out


def breakdown(windows: Sequence[Window]) -> str:
    """Median over rounds of each process group, the request path's groups first."""
    groups = [by_process(w) for w in windows if w.requests]
    if not groups:
        return "-"
    names = sorted({g for d in groups for g in d} - {"gone"},
                   key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER), g))
    parts = []
    for name in names:
        value = statistics.median(d.get(name, 0.0) for d in groups)
        if name in GROUP_ORDER[2:] or value >= 1:
            parts.append(f"{name} {value:.0f}")
    return " · ".join(parts)


def render(results: dict[tuple[str, str], list[Window]], cases: Sequence[str], servers: Sequence[str]) -> str:
    """The markdown table: per case, µs/request min-max per server, median per-round ratios,
    base's and head's breakdowns by process."""
    triton = "Triton" in servers
    head = ["case"] + [f"{s} µs/req" for s in servers]
    head += ["base / Triton", "head / Triton"] if triton else []
    head += ["head / base", "base by process, µs/req", "head by process, µs/req"]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 3) + "---|---|"]
    for name in cases:
        us = {s: [w.us_per_request for w in results.get((name, s), [])] for s in servers}
        cells = [LOADS[name].label] + [span(us[s]) for s in servers]
        if triton:
            cells += [median_ratio(us["base"], us["Triton"]), median_ratio(us["head"], us["Triton"])]
        cells += [median_ratio(us["head"], us["base"]), breakdown(results.get((name, "base"), [])),
                  breakdown(results.get((name, "head"), []))]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def rotated(names: Sequence[str], turn: int) -> list[str]:
    k = turn % len(names)
    return list(names[k:]) + list(names[:k])


def package_links(setup_cfg: str) -> dict[str, str]:
    """tritond.X packages that setup.cfg's package_dir maps to a top-level folder X' of the
    tree: {X: X'}, the links that make <tree>/tritond a complete package on PYTHONPATH."""
    cfg = configparser.ConfigParser()
    cfg.read_string(setup_cfg)
    links = {}
    for line in cfg.get("options", "package_dir", fallback="").splitlines():
        if "=" not in line:
            continue
        package, folder = (part.strip() for part in line.split("=", 1))
        parts = package.split(".")
        if len(parts) == 2 and parts[0] == "tritond" and folder.strip("/") != f"tritond/{parts[1]}":
            links[parts[1]] = folder.strip("/")
    return links


# ---------------------------------------------------------------- git

def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def default_base(run: Callable[..., str] = git) -> str:
    """The merge-base of HEAD with main; HEAD~1 where that is HEAD itself (or there is no main)."""
    head = run("rev-parse", "HEAD")
    try:
        base = run("merge-base", "HEAD", "main")
    except subprocess.CalledProcessError:
        base = head
    return base if base != head else "HEAD~1"


@contextlib.contextmanager
def checkout(revision: str, dest: Path) -> Iterator[Path]:
    """`revision` in a temporary git worktree at dest, importable as tritond from PYTHONPATH;
    the worktree is removed on the way out."""
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(dest), revision],
                       check=True, capture_output=True, text=True)
        setup_cfg = dest / "setup.cfg"
        for name, folder in (package_links(setup_cfg.read_text()) if setup_cfg.exists() else {}).items():
            link = dest / "tritond" / name
            if not link.exists():
                link.symlink_to(Path("..") / folder)
        yield dest
    finally:
        with signals_held():
            done = subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(dest)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(dest, ignore_errors=True)
                subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def tree_env(tree: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    # TRITOND_TREE: the development shim that points an editable install at a worktree
    return dict(os.environ, PYTHONPATH=f"{tree}:{path}" if path else str(tree), TRITOND_TREE=str(tree))


def imported_from(env: dict[str, str] | None, cwd: Path) -> list[str]:
    """Where tritond's packages come from under env and in cwd (the server's processes inherit
    both; `python -m` puts the working directory first on sys.path)."""
    code = ("import importlib.util as u\n"
            "for m in ('tritond', 'tritond.broker', 'tritond.frontend', 'tritond.workers', 'tritond.wire'):\n"
            "    print(u.find_spec(m).origin)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.split()


def check_tree(env: dict[str, str] | None, tree: Path, what: str) -> None:
    stray = [o for o in imported_from(env, tree) if not Path(o).resolve().is_relative_to(tree.resolve())]
    if stray:
        raise SystemExit(f"{what}: tritond would import from {', '.join(stray)}, not from {tree}")


# ---------------------------------------------------------------- the run

@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C / SIGTERM wait until the block is done (a stop or a removal is never cut short)."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def on_exit(stack: contextlib.ExitStack, fn: Callable[[], object]) -> None:
    """fn on the way out of stack, not cut short by a signal (children never start with the
    signals held: they would inherit the mask)."""
    def run() -> None:
        with signals_held():
            fn()
    stack.callback(run)


def server_version(http: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{http}/v2", timeout=5) as resp:
            meta = json.load(resp)
        return f"{meta.get('name', '?')} {meta.get('version', '?')}"
    except (OSError, ValueError):
        return "?"


def measure(servers: dict[str, Triton | Server], args: argparse.Namespace) -> dict[tuple[str, str], list[Window]]:
    results: dict[tuple[str, str], list[Window]] = {}
    for r in range(args.rounds):
        for name in args.cases:
            load = LOADS[name]
            for server in rotated(list(servers), r):
                s = servers[server]
                url = s.http if load.case.protocol == "http" else s.grpc
                count, seconds, cpu = asyncio.run(bench_cpu.measure(url, s.proc.pid, load.case, load.concurrency,
                                                                    args.window, args.warmup))
                w = Window(count, seconds, cpu)
                results.setdefault((name, server), []).append(w)
                print(f"round {r + 1}/{args.rounds} {name} {server}: {count / seconds:,.0f} infer/s, "
                      f"{w.us_per_request:.0f} µs CPU/request", file=sys.stderr)
    return results


def run(args: argparse.Namespace) -> str:
    base = git("rev-parse", "--verify", f"{args.base or default_base()}^{{commit}}")
    base_label = git("log", "-1", "--format=%h %s", base)
    dirty = git("status", "--porcelain", "--untracked-files=no")
    head_label = git("log", "-1", "--format=%h", "HEAD") + (" + uncommitted changes" if dirty else "")
    check_tree(None, ROOT, "head")
    if not args.no_triton and not anchors_ready(args.anchors_dir):
        try:
            prepare(args.anchors_dir)
        except AnchorsError as exc:
            raise SystemExit(f"cannot prepare real Triton in {args.anchors_dir}: {exc}\n"
                             f"(prepare it with ANCHORS_DIR={args.anchors_dir} SKIP_PA=1 SKIP_LOADGEN=1 bash "
                             f"../shared/bench-anchors/run_anchors.sh, or run with --no-triton)")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-compare-")))
        repository = tmp / "models"
        build_repository(repository, [MODEL])
        base_tree = stack.enter_context(checkout(base, tmp / "base"))
        base_env = tree_env(base_tree)
        check_tree(base_env, base_tree, "base")
        servers: dict[str, Triton | Server] = {}
        if not args.no_triton:
            servers["Triton"] = Triton(args.anchors_dir, repository, tmp / "triton.log")
            on_exit(stack, servers["Triton"].stop)
        for name, tree, env in (("base", base_tree, base_env), ("head", ROOT, None)):
            servers[name] = Server(repository, tmp / f"{name}.log", env=env, cwd=tree, new_session=True)
            on_exit(stack, servers[name].stop)
        for s in servers.values():
            s.wait_ready(READY_TIMEOUT_S)
        versions = {name: server_version(s.http) for name, s in servers.items()}
        print("servers: " + ", ".join(f"{n} {s.http} (pid {s.proc.pid}, {versions[n]})" for n, s in servers.items()),
              file=sys.stderr)
        results = measure(servers, args)
    table = render(results, args.cases, list(servers))
    rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
    notes = [f"CPU µs per request (user + system, every process and thread of the server's tree), min–max over "
             f"{rounds} of {args.window:g} s windows (after {args.warmup:g} s warm-up); ratios are medians of "
             f"per-round ratios; identity_fp32, 16 FP32, closed loop with c clients.",
             f"base: {base_label}", f"head: working tree at {head_label}"]
    if "Triton" in versions:
        notes.append(f"Triton: {versions['Triton']} (nvidia-pytriton, Python backend)")
    return table + "\n\n" + "\n".join(notes)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        print(run(args))
    except KeyboardInterrupt:
        print("interrupted: servers stopped, worktree removed", file=sys.stderr)
        return 130
    except ServerStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"{' '.join(exc.cmd)} failed: {(exc.stderr or '').strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
