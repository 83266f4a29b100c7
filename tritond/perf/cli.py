"""`tritond perf`: perf_analyzer's core options with perf_analyzer's meaning. Runs the real
perf_analyzer when it is installed (unless `--engine python`), else the asyncio engine; both
print the same report and write the same `-f` CSV."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import binary as pa
from .control import ControlError, connect
from .engine import STABILITY_WINDOW, LevelResult, MeasureError, MeasureOptions
from .inputs import InputDataError, parse_shapes
from .progress import Display
from .results import describe, summary_lines, write_csv
from .session import PerfOptions, PerfSession


class UsageError(ValueError):
    pass


class Unstable(Exception):
    """A level did not stabilize: perf_analyzer ends the run there, and so does the engine."""


def parse_range(text: str, integer: bool) -> list[float]:
    """perf_analyzer's `start[:end[:step]]`, end inclusive."""
    conv = int if integer else float
    try:
        parts = [conv(p) for p in text.split(":")]
    except ValueError:
        raise UsageError(f"{text!r}: expected start[:end[:step]] with {'integers' if integer else 'numbers'}") from None
    if not 1 <= len(parts) <= 3:
        raise UsageError(f"{text!r}: expected start[:end[:step]]")
    start = parts[0]
    end = parts[1] if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else conv(1)
    if start <= 0 or step <= 0:
        raise UsageError(f"{text!r}: start and step must be positive")
    if end == 0:
        raise UsageError(f"{text!r}: an open range (end 0, searching up to a latency limit) is not supported")
    if end < start:
        raise UsageError(f"{text!r}: end is below start")
    out, value, i = [], start, 0
    while value <= end + 1e-9:
        out.append(value)
        i += 1
        value = start + i * step
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritond perf", description=__doc__)
    p.add_argument("-m", dest="model", required=True, help="model name")
    p.add_argument("-x", dest="version", default="", help="model version (default: the server's choice)")
    p.add_argument("-u", dest="url", default=None, help="server URL host:port (default localhost:8000, gRPC :8001)")
    p.add_argument("-i", dest="protocol", choices=["http", "grpc"], default="http", type=str.lower)
    p.add_argument("-b", dest="batch_size", type=int, default=1, help="batch size of each request")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", default=None, metavar="START:END:STEP")
    load.add_argument("--request-rate-range", default=None, metavar="START:END:STEP")
    p.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2", help="shape of a variable-sized input")
    p.add_argument("--input-data", default="random", help="zero, random, or a JSON file in perf_analyzer's format")
    p.add_argument("--string-length", type=int, default=128)
    p.add_argument("--string-data", default=None)
    p.add_argument("--shared-memory", choices=["none", "system"], default="none")
    p.add_argument("--output-shared-memory-size", type=int, default=102400)
    p.add_argument("--input-tensor-format", choices=["binary", "json"], default="binary", help="HTTP only")
    p.add_argument("-p", "--measurement-interval", type=int, default=5000, help="window length in ms")
    p.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    p.add_argument("-r", "--max-trials", type=int, default=10, help="most windows per level")
    p.add_argument("--percentile", type=int, default=-1, help="stabilize on and report this latency percentile")
    p.add_argument("-f", dest="csv", default=None, help="write perf_analyzer's CSV report here")
    p.add_argument("--verbose-csv", action="store_true")
    p.add_argument("--engine", choices=["auto", "perf_analyzer", "python"], default="auto",
                   help="auto: perf_analyzer when installed, else the built-in engine")
    return p


def options(args: argparse.Namespace) -> tuple[PerfOptions, str, list[float], str, str]:
    """(options, mode, levels, perf_analyzer range flag, its text) from parsed arguments."""
    if args.measurement_interval <= 0:
        raise UsageError("--measurement-interval must be positive")
    if args.max_trials < 3:
        raise UsageError("--max-trials must be at least 3: stability is judged over the last 3 windows")
    if args.stability_percentage <= 0:
        raise UsageError("--stability-percentage must be positive")
    if not (args.percentile == -1 or 0 < args.percentile < 100):
        raise UsageError("--percentile must be in 1..99 (or -1 for the average)")
    if args.protocol == "grpc" and args.input_tensor_format != "binary":
        raise UsageError("--input-tensor-format applies to HTTP only")
    if args.request_rate_range is not None:
        mode, flag, text = "request_rate", "request-rate-range", args.request_rate_range
        levels = parse_range(text, integer=False)
    else:
        mode, flag, text = "concurrency", "concurrency-range", args.concurrency_range or "1"
        levels = parse_range(text, integer=True)
    url = args.url or ("localhost:8000" if args.protocol == "http" else "localhost:8001")
    measure = MeasureOptions(interval_s=args.measurement_interval / 1000.0, stability=args.stability_percentage / 100.0,
                             max_trials=args.max_trials, percentile=args.percentile, batch_size=args.batch_size)
    opts = PerfOptions(model=args.model, url=url, protocol=args.protocol, version=args.version,
                       batch_size=args.batch_size, shapes=parse_shapes(args.shape), input_data=args.input_data,
                       string_data=args.string_data, string_length=args.string_length,
                       shared_memory=args.shared_memory, output_shm_size=args.output_shared_memory_size,
                       input_format=args.input_tensor_format, request_distribution=args.request_distribution,
                       measure=measure)
    return opts, mode, levels, flag, text


def _settings(opts: PerfOptions, mode: str, levels: Sequence[float]) -> str:
    m = opts.measure
    what = "average latency" if m.percentile < 0 else f"p{m.percentile} latency"
    load = (f"Concurrency limit: {int(max(levels))} concurrent requests" if mode == "concurrency"
            else f"Request rate limit: {max(levels):g} requests per second ({opts.request_distribution})")
    return "\n".join(["*** Measurement Settings ***", f"  Batch size: {opts.batch_size}",
                      "  Engine: tritond (asyncio)", '  Using "time_windows" mode for stabilization',
                      f"  Stabilizing using {what} and throughput",
                      f"  Measurement window: {int(m.interval_s * 1000)} msec", f"  {load}", ""])


def _level_heading(mode: str, level: float) -> str:
    return f"Request concurrency: {int(level)}" if mode == "concurrency" else \
        f"Request Rate: {level:.2f} inference requests per seconds"


def run_engine(opts: PerfOptions, mode: str, levels: Sequence[float], csv_path: str | None,
               verbose_csv: bool, display: Display) -> int:
    control = connect(opts.url, opts.protocol)
    session = PerfSession(opts, control)
    results: list[LevelResult] = []
    label = ""
    print(_settings(opts, mode, levels), flush=True)

    def on_start(m: str, level: float) -> None:
        nonlocal label
        label = _level_heading(m, level)
        print(label, flush=True)
        display.level(label, opts.measure.max_trials)

    def on_window(done: int, total: int, ips: float, lat_ns: float, stable: bool) -> None:
        display.window(label, done, total, ips, lat_ns / 1e6, stable)

    def on_level(result: LevelResult) -> None:
        display.level_done()
        results.append(result)
        if not result.stable:
            print(f"Failed to obtain stable measurement within {opts.measure.max_trials} measurement windows for "
                  f"{_level_name(result)}. Please try to increase the --measurement-interval. Its last "
                  f"{STABILITY_WINDOW} windows are reported, marked unstable, and the sweep ends here.",
                  file=sys.stderr, flush=True)
        print(describe(result, opts.measure.percentile) + "\n", flush=True)
        if not result.stable:
            raise Unstable()

    try:
        session.prepare()
        try:
            session.run(mode, levels, on_start=on_start, on_window=on_window, on_level=on_level)
        except Unstable:
            pass
    except (ControlError, InputDataError, MeasureError) as e:
        print(f"tritond perf: error: {e}", file=sys.stderr)
        return 1
    finally:
        session.close()
        control.close()
    if not results:
        print("Failed to obtain stable measurement.", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(results, opts.measure.percentile)), flush=True)
    if csv_path:
        write_csv(csv_path, results, verbose_csv, opts.measure.percentile)
    unstable = [r for r in results if not r.stable]
    if unstable:
        print(f"Note: {_level_name(unstable[0])} is unstable: its figures{f' in {csv_path}' if csv_path else ''} "
              f"are those of its last {STABILITY_WINDOW} windows, which varied by more than "
              f"{opts.measure.stability * 100:g}%; a longer --measurement-interval, a higher "
              f"--stability-percentage or a quieter host steadies them.", file=sys.stderr, flush=True)
    return 2 if len(unstable) == len(results) else 0


def _level_name(result: LevelResult) -> str:
    return f"concurrency {int(result.level)}" if result.mode == "concurrency" else f"request rate {result.level:g}"


class NothingStable(Exception):
    """perf_analyzer ended without a stable level, so it reported and wrote nothing."""


def run_binary(binary: str, opts: PerfOptions, flag: str, text: str, levels: Sequence[float],
               csv_path: str | None, verbose_csv: bool, display: Display) -> int:
    """perf_analyzer's exit status; NothingStable (with that status) when it failed for want of a
    stable level."""
    label = ""
    unstable = False

    def on_level(level: float) -> None:
        nonlocal label
        display.level_done()
        label = _level_heading("concurrency" if flag == "concurrency-range" else "request_rate", level)
        display.level(label, opts.measure.max_trials)

    def on_pass(done: int, ips: float, lat_ns: float) -> None:
        display.window(label, done, opts.measure.max_trials, ips, lat_ns / 1e6, False)

    def echo(line: str) -> None:
        nonlocal unstable
        if line.startswith(("  Client:", "Inferences/Second")):
            display.level_done()
        unstable = unstable or line.startswith("Failed to obtain stable measurement")
        print(line, flush=True)

    cmd = pa.command(binary, opts, flag, text, csv_path, verbose_csv)
    code = pa.run(cmd, on_level, on_pass, echo)
    if code != 0 and unstable:
        raise NothingStable(code)
    return code


def main(argv: Sequence[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        opts, mode, levels, flag, text = options(args)
    except (UsageError, InputDataError) as e:
        p.print_usage(sys.stderr)
        print(f"tritond perf: error: {e}", file=sys.stderr)
        return 1
    binary = pa.find_perf_analyzer() if args.engine != "python" else None
    if args.engine == "perf_analyzer" and binary is None:
        print("tritond perf: error: --engine perf_analyzer: perf_analyzer is not installed "
              "(bash scripts/install-perf-analyzer .venv/perf_analyzer)", file=sys.stderr)
        return 1
    try:
        with Display() as display:
            if binary is not None:
                try:
                    return run_binary(binary, opts, flag, text, levels, args.csv, args.verbose_csv, display)
                except NothingStable as failed:
                    if args.engine != "auto":
                        return failed.args[0]
                    print("tritond perf: perf_analyzer found no stable level and wrote nothing; measuring again "
                          "with tritond's engine, which reports an unstable level's figures", file=sys.stderr,
                          flush=True)
            return run_engine(opts, mode, levels, args.csv, args.verbose_csv, display)
    except KeyboardInterrupt:
        print("tritond perf: interrupted", file=sys.stderr)
        return 130
