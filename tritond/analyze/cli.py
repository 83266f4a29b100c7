"""`tritond analyze -m MODEL`: find the model config that best meets an objective by
reconfiguring the model in a running tritond and measuring each config with `tritond perf`.

Without `-u`, it starts its own tritond on free loopback ports (explicit model control) over
`--repository`. It writes the winning config (next to the model as `configs/analyzed.pbtxt`,
which `tritond start --model-config-name=analyzed` picks up, or to `--config-out DIR`), a CSV
of every measured point and a self-contained HTML report into `--output-dir`. Ctrl-C stops
the sweep and still writes what it has.
"""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tritond.perf.control import ControlError, connect
from tritond.perf.engine import MeasureError, MeasureOptions
from tritond.perf.inputs import InputDataError, parse_shapes
from tritond.perf.progress import Display
from tritond.perf.session import PerfOptions, PerfSession

from .objective import Objective
from .outputs import config_text, write_trials_csv
from .report import Outcome, render
from .server import LocalServer, ServerError
from .space import Candidate, Space, default_space, from_config
from .sweep import Sweep

CONFIG_NAME = "analyzed"


class UsageError(ValueError):
    pass


def _ints(text: str, what: str, minimum: int = 0) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise UsageError(f"{what}: expected integers >= {minimum}, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritond analyze", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", dest="model", required=True)
    where = p.add_argument_group("server")
    where.add_argument("--repository", type=Path, help="model repository (serves it unless -u is given)")
    where.add_argument("-u", dest="url", help="a running tritond with --model-control-mode=explicit")
    where.add_argument("-i", dest="protocol", choices=["http", "grpc"], default="http", type=str.lower)
    goal = p.add_argument_group("objective")
    goal.add_argument("--objective", choices=["throughput", "latency"], default="throughput",
                      help="maximise throughput (default) or minimise latency")
    goal.add_argument("--max-latency-ms", type=float, help="latency limit at --latency-percentile")
    goal.add_argument("--latency-percentile", type=int, default=99)
    goal.add_argument("--min-throughput", type=float, help="throughput floor, infer/s")
    goal.add_argument("--memory-budget-mb", type=float, help="limit on the model's worker memory (PSS)")
    space = p.add_argument_group("search space (comma-separated values; defaults from the model)")
    space.add_argument("--search", choices=["quick", "brute"], default="quick")
    space.add_argument("--max-instances", type=int, help="instance counts 1..N")
    space.add_argument("--instances", help="instance counts to try")
    space.add_argument("--max-batch-sizes")
    space.add_argument("--dynamic-batching", choices=["both", "on", "off"], default="both")
    space.add_argument("--queue-delays-us")
    space.add_argument("--preferred-batch-sizes", help="0 stands for none (the batcher's default)")
    space.add_argument("--thread-counts", help="ONNX Runtime intra_op_thread_count values (0: not set)")
    space.add_argument("--concurrency", help="concurrency levels, ascending (default 1,2,4,8,16,32)")
    perf = p.add_argument_group("measurement (as tritond perf)")
    perf.add_argument("-b", dest="batch_size", type=int, default=1)
    perf.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2")
    perf.add_argument("--input-data", default="random")
    perf.add_argument("--shared-memory", choices=["none", "system"], default="none")
    perf.add_argument("-p", "--measurement-interval", type=int, default=2000, help="window length in ms")
    perf.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    perf.add_argument("-r", "--max-trials", type=int, default=5, help="most windows per level (at least 3)")
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, help="report, CSV and server log (default ./analyze-MODEL)")
    out.add_argument("--config-out", type=Path, help="write the winning config.pbtxt into this folder")
    return p


def objective_of(args: argparse.Namespace) -> Objective:
    if not 0 < args.latency_percentile < 100:
        raise UsageError("--latency-percentile must be in 1..99")
    for name in ("max_latency_ms", "min_throughput", "memory_budget_mb"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.memory_budget_mb is not None and args.url:
        raise UsageError("--memory-budget-mb needs the server that tritond analyze starts itself (no -u): "
                         "it reads the model's worker processes")
    return Objective(args.objective, args.latency_percentile, args.max_latency_ms, args.min_throughput,
                     args.memory_budget_mb)


def space_of(args: argparse.Namespace, base: Candidate, backend: str) -> Space:
    space = default_space(base, backend)
    batching = base.max_batch_size > 0
    if args.instances:
        space.instances = _ints(args.instances, "--instances", 1)
    elif args.max_instances:
        space.instances = list(range(1, args.max_instances + 1))
    batch_flags = [args.max_batch_sizes, args.queue_delays_us, args.preferred_batch_sizes]
    if not batching and (any(batch_flags) or args.dynamic_batching == "on"):
        raise UsageError("the model does not batch (max_batch_size 0): batching options do not apply")
    if args.max_batch_sizes:
        space.max_batch_sizes = _ints(args.max_batch_sizes, "--max-batch-sizes", 1)
    if batching:
        space.dynamic = {"both": [False, True], "on": [True], "off": [False]}[args.dynamic_batching]
    if args.queue_delays_us:
        space.queue_delays_us = _ints(args.queue_delays_us, "--queue-delays-us", 0)
    if args.preferred_batch_sizes:
        space.preferred = [(v,) if v else () for v in _ints(args.preferred_batch_sizes, "--preferred-batch-sizes")]
    if args.thread_counts:
        if backend != "onnxruntime":
            raise UsageError(f"--thread-counts applies to ONNX Runtime models; this one runs on {backend or 'an unknown backend'}")
        space.threads = _ints(args.thread_counts, "--thread-counts", 0)
    if args.concurrency:
        space.concurrency = sorted(set(_ints(args.concurrency, "--concurrency", 1)))
    return space


def _config_path(args: argparse.Namespace, output_dir: Path) -> Path:
    if args.config_out:
        return args.config_out / "config.pbtxt"
    if args.repository:
        return args.repository / args.model / "configs" / f"{CONFIG_NAME}.pbtxt"
    return output_dir / "config.pbtxt"


def _outcome(sweep: Sweep, confirmed, config_path: Path | None, runtime: float, command: str,
             server: str) -> Outcome:
    o = sweep.objective
    winner = confirmed
    if winner is None:
        ranked = [tp for tp in sweep.ranking() if o.feasible(tp[1])]
        winner = ranked[0] if ranked else None
    base_trial = sweep.trials[0] if sweep.trials and sweep.trials[0].points else None
    base = (base_trial, sweep.best_of(base_trial)) if base_trial else None
    return Outcome(winner, confirmed is not None, sweep.confirmation if confirmed else [], base,
                   config_path if winner else None, runtime, command, server)


def main(argv: Sequence[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:   # the report's plots, checked before any work
        print("tritond analyze: error: the report needs matplotlib: pip install 'tritond[analyze]'", file=sys.stderr)
        return 1
    try:
        objective = objective_of(args)
        if not args.url and not args.repository:
            raise UsageError("give --repository DIR (analyze serves it) or -u URL (a running tritond in explicit mode)")
        if args.repository and not (args.repository / args.model).is_dir():
            raise UsageError(f"{args.repository / args.model} is not a model directory")
        if args.max_trials < 3:
            raise UsageError("--max-trials must be at least 3: stability is judged over the last 3 windows")
        shapes = parse_shapes(args.shape)
    except (UsageError, InputDataError) as e:
        p.print_usage(sys.stderr)
        print(f"tritond analyze: error: {e}", file=sys.stderr)
        return 1
    output_dir = args.output_dir or Path(f"analyze-{args.model}")
    output_dir.mkdir(parents=True, exist_ok=True)
    command = "tritond analyze " + " ".join(shlex.quote(a) for a in argv)
    started = time.monotonic()
    server = control = session = None
    try:
        if args.url:
            url, where = args.url, f"{args.url} ({args.protocol})"
        else:
            print(f"starting tritond over {args.repository} (log: {output_dir / 'server.log'})", file=sys.stderr)
            server = LocalServer(args.repository, args.model, output_dir / "server.log",
                                 shared_memory=args.shared_memory == "system").start()
            url = server.url(args.protocol)
            where = f"started by tritond analyze on {url} ({args.protocol})"
        control = connect(url, args.protocol)
        if not control.is_model_ready(args.model):
            control.load_model(args.model)
        base_config = control.model_config(args.model)
        if base_config.get("platform") == "ensemble":
            raise UsageError("an ensemble has no instances or batcher of its own: analyze its composing models")
        try:
            control.load_model(args.model, base_config)   # the server reloads models with a config
        except ControlError as e:
            raise UsageError(f"reloading {args.model} with a config failed: {e} "
                             "(tritond analyze needs --model-control-mode=explicit)") from None
        base = from_config(base_config)
        space = space_of(args, base, base_config.get("backend", ""))
        measure = MeasureOptions(interval_s=args.measurement_interval / 1000, stability=args.stability_percentage / 100,
                                 max_trials=args.max_trials, percentile=objective.percentile,
                                 batch_size=args.batch_size)
        session = PerfSession(PerfOptions(model=args.model, url=url, protocol=args.protocol,
                                          batch_size=args.batch_size, shapes=shapes, input_data=args.input_data,
                                          shared_memory=args.shared_memory, measure=measure), control)
        session.prepare()
        with Display() as display:
            sweep = Sweep(control, session, args.model, base_config, space, objective, display,
                          memory=server.model_memory_mb if server else (lambda: None))
            display.log(f"analyzing {args.model}: {objective.describe()}; {args.search} search over "
                        f"{', '.join(space.dimensions(base)) or 'concurrency only'}")
            confirmed = None
            try:
                sweep.quick() if args.search == "quick" else sweep.brute()
                confirmed = sweep.confirm()
            except KeyboardInterrupt:
                sweep.interrupted = True
                display.log("interrupted: writing what was measured")
            finally:
                if server is None:
                    sweep.restore()
    except (UsageError, ServerError, ControlError, InputDataError, MeasureError) as e:
        print(f"tritond analyze: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tritond analyze: interrupted before any measurement", file=sys.stderr)
        return 130
    finally:
        if session is not None:
            session.close()
        if control is not None:
            control.close()
        if server is not None:
            server.stop()
    runtime = time.monotonic() - started
    outcome = _outcome(sweep, confirmed, _config_path(args, output_dir), runtime, command, where)
    return _write(sweep, outcome, args, output_dir)


def _write(sweep: Sweep, outcome: Outcome, args: argparse.Namespace, output_dir: Path) -> int:
    o = sweep.objective
    if outcome.winner is not None and outcome.config_path is not None:
        trial, point = outcome.winner
        comment = (f"Written by tritond analyze: {o.describe()}.\n"
                   f"Measured {point.infer_per_sec:,.1f} infer/s, p{o.percentile} {point.latency_ms:.2f} ms "
                   f"at concurrency {point.concurrency} ({trial.candidate.label()}).")
        original = args.repository / args.model / "config.pbtxt" if args.repository else None
        outcome.config_path.parent.mkdir(parents=True, exist_ok=True)
        outcome.config_path.write_text(config_text(trial.candidate, trial.server_config, original, comment))
    write_trials_csv(output_dir / "trials.csv", sweep)
    report = output_dir / "report.html"
    report.write_text(render(sweep, outcome, args.model))
    print(f"\n{len(sweep.trials)} configurations, {len(sweep.points())} points in {outcome.runtime_s:.0f} s")
    if not sweep.points():
        print(f"nothing could be measured (the reasons are in {output_dir / 'trials.csv'})")
    elif outcome.winner is None:
        print(f"no configuration met the limits ({o.describe()}); nothing written as config")
    else:
        trial, point = outcome.winner
        print(f"winner: #{trial.id} {trial.candidate.label()} at concurrency {point.concurrency}: "
              f"{point.infer_per_sec:,.1f} infer/s, p{o.percentile} {point.latency_ms:.2f} ms"
              + ("" if outcome.confirmed else " (not confirmed on rerun)"))
        if outcome.base is not None and o.feasible(outcome.base[1]):
            b = outcome.base[1]
            print(f"bundled config: {b.infer_per_sec:,.1f} infer/s, p{o.percentile} {b.latency_ms:.2f} ms "
                  f"at concurrency {b.concurrency}; gain {o.gain(point, b):.2f}x")
        pairs = [(w, b) for w, b in outcome.confirmation if b is not None]
        if pairs:
            gains = [o.gain(w, b) for w, b in pairs]
            print("measured again alternately: " + "; ".join(
                f"winner {w.infer_per_sec:,.1f} infer/s (p{o.percentile} {w.latency_ms:.2f} ms) vs bundled "
                f"{b.infer_per_sec:,.1f} infer/s (p{o.percentile} {b.latency_ms:.2f} ms)" for w, b in pairs)
                  + f"; gain {sum(gains) / len(gains):.2f}x")
        print(f"config: {outcome.config_path}")
        if args.repository and not args.config_out:
            print(f"  serve it with: tritond start --model-repository {args.repository} "
                  f"--model-config-name={CONFIG_NAME}")
    print(f"trials: {output_dir / 'trials.csv'}\nreport: {report}")
    if sweep.interrupted:
        return 130
    if not sweep.points():
        return 1
    return 0 if outcome.winner is not None else 2
