"""The observability and cache flags, parsed with tritonserver's syntax and checks:
`--log-*`, `--metrics-config`, `--metrics-interval-ms`, `--trace-config`, `--cache-config`
(and the deprecated `--response-cache-byte-size`). Each returns plain data for its group of the
server options (wire/options.py, whose defaults they start from); a value tritond does not
implement is a usage error."""
from __future__ import annotations

import argparse
import os
import re
from typing import Any

import msgspec

from tritond.wire.options import DEFAULTS
from tritond.wire.schema import LOG_FORMATS, LogConfig

TRACE_MODES = ("triton", "opentelemetry")


class FlagError(ValueError):
    """A flag value tritonserver would refuse, or one tritond does not implement."""


def add_flags(p: argparse.ArgumentParser, flag: Any) -> None:
    log = DEFAULTS.log
    p.add_argument("--log-file", default=log.file, metavar="PATH", help="append every process's log lines to PATH")
    p.add_argument("--log-format", default=log.format, metavar="FORMAT", help="default | ISO8601 | json (one object per line)")
    flag(p, "--log-info", log.info, "log INFO lines")
    flag(p, "--log-warning", log.warning, "log WARNING lines")
    flag(p, "--log-error", log.error, "log ERROR lines")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="counter_latencies, summary_latencies, summary_quantiles, histogram_latencies (repeatable)")
    p.add_argument("--metrics-interval-ms", type=float, default=DEFAULTS.metrics.interval_ms, metavar="MS",
                   help="how often the CPU and GPU metrics are sampled")
    flag(p, "--allow-cpu-metrics", DEFAULTS.cpu_metrics, "report nv_cpu_* and the process tree's CPU and memory")
    flag(p, "--allow-gpu-metrics", DEFAULTS.gpu_metrics, "report nv_gpu_* through NVML when GPUs exist")
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="level=OFF|TIMESTAMPS, rate, count, mode=triton|opentelemetry, triton,file, "
                        "triton,log-frequency, opentelemetry,url ... (repeatable; default: tracing off)")
    for name, setting, _ in DEPRECATED_TRACE_FLAGS:
        p.add_argument(name, action="append", default=[], metavar="VALUE",
                       help=f"deprecated: --trace-config {setting}=VALUE")
    p.add_argument("--cache-config", action="append", default=[], metavar="CACHE,SETTING=VALUE",
                   help="local,size=BYTES: the response cache (default: none)")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated: --cache-config local,size=BYTES")


def log_settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.log_format not in LOG_FORMATS:
        raise FlagError(f"invalid argument for --log-format, got: {args.log_format} "
                        f"(expected {', '.join(LOG_FORMATS)})")
    if args.log_verbose < 0:
        raise FlagError("--log-verbose must be a non-negative integer")
    path = args.log_file        # as given: the logging API reports it so (each process resolves it once)
    if path:
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as e:
            raise FlagError(f"--log-file: cannot open '{path}' for appending: {e.strerror}") from None
    cfg = LogConfig(info=args.log_info, warning=args.log_warning, error=args.log_error,
                    verbose=args.log_verbose, format=args.log_format, file=path)
    return msgspec.to_builtins(cfg)


def _bool(value: str, what: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise FlagError(f"{what} expects true or false, got '{value}'")


_LEADING_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _leading_float(text: str) -> float:
    """The number `text` starts with, as tritonserver reads it (std::stod: '0.0.1' is 0.0)."""
    m = _LEADING_NUMBER.match(text)
    if m is None:
        raise ValueError(text)
    return float(m.group())


def parse_quantiles(text: str) -> list[tuple[float, float]]:
    """'0.5:0.05,0.9:0.01' -> [(0.5, 0.05), (0.9, 0.01)]: Triton's <quantile>:<error> pairs."""
    out = []
    for pair in text.split(","):
        q, sep, err = pair.strip().partition(":")
        try:
            qv, ev = _leading_float(q), _leading_float(err)
        except ValueError:
            qv = ev = -1.0
        if not sep or not 0.0 <= qv <= 1.0 or not 0.0 <= ev < 1.0:
            raise FlagError(f"--metrics-config summary_quantiles: invalid pair '{pair}', expected "
                            f"<quantile>:<error> with both in [0, 1]")
        out.append((qv, ev))
    return out


def metrics_settings(entries: list[str], interval_ms: float) -> dict[str, Any]:
    """`--metrics-config <setting>=<value>` (repeatable) and `--metrics-interval-ms`."""
    cfg: dict[str, Any] = msgspec.to_builtins(DEFAULTS.metrics)
    for entry in entries:
        setting, eq, value = entry.partition("=")
        if not eq or not setting or not value or "," in setting:
            raise FlagError(f"--metrics-config option format is <setting>=<value>. Got {entry}")
        if setting in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            cfg[setting] = _bool(value, f"--metrics-config {setting}")
        elif setting == "summary_quantiles":
            cfg[setting] = parse_quantiles(value)
        else:
            raise FlagError(f"--metrics-config setting '{setting}' is not supported by tritond (supported: "
                            f"counter_latencies, summary_latencies, summary_quantiles, histogram_latencies)")
    if not interval_ms > 0:
        raise FlagError(f"--metrics-interval-ms must be positive, got {interval_ms:g}")
    cfg["interval_ms"] = interval_ms
    return cfg


# tritonserver's older trace flags, each an alias of one --trace-config setting (repeatable, as
# --trace-level is in tritonserver; the last value of the others wins).
DEPRECATED_TRACE_FLAGS = (
    ("--trace-file", "triton,file", "triton,file=<filepath>"),
    ("--trace-level", "level", "level=<OFF|TIMESTAMPS|TENSORS>"),
    ("--trace-rate", "rate", "rate=<rate value>"),
    ("--trace-count", "count", "count=<count value>"),
    ("--trace-log-frequency", "triton,log-frequency", "triton,log-frequency=<log frequency value>"),
)
BSP_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
# tritonserver's words for the trace levels
TRACE_LEVELS = {"off": "OFF", "false": "OFF", "timestamps": "TIMESTAMPS", "true": "TIMESTAMPS",
                "on": "TIMESTAMPS", "min": "TIMESTAMPS", "max": "TIMESTAMPS", "tensors": "TENSORS"}


def deprecated_trace_entries(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(--trace-config entries, warning lines) for the deprecated trace flags given. They come
    before the --trace-config entries, so a --trace-config setting wins, as in tritonserver."""
    entries: list[str] = []
    warnings: list[str] = []
    for flag, setting, usage in DEPRECATED_TRACE_FLAGS:
        values = getattr(args, flag[2:].replace("-", "_"), None) or []
        for value in values:
            entries.append(f"{setting}={value}")
        if values:      # tritonserver's words, which scripts grep for
            warnings.append(f"Warning: '{flag}' has been deprecated and will be removed in future releases. "
                            f"Please use '--trace-config {usage} instead.")
    return entries, warnings


def _uint(value: str, what: str, minimum: int = 0) -> int:
    try:
        n = int(value)
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise FlagError(f"--trace-config {what} must be an integer >= {minimum}, got '{value}'")
    return n


def _bsp(value: str, what: str) -> int:
    """A batch span processor setting (an unsigned integer), refused in tritonserver's words."""
    try:
        n = int(value.strip())
    except ValueError:
        n = -1
    if not 0 <= n < 2 ** 32:
        raise FlagError(f"Bad option: {what}.\nInvalid argument: '{value}' is not an unsigned 32-bit integer")
    return n


def trace_settings(entries: list[str]) -> dict[str, Any]:
    """`--trace-config [<mode>,]<setting>=<value>` (repeatable), Triton's keys and defaults."""
    cfg: dict[str, Any] = msgspec.to_builtins(DEFAULTS.trace)
    levels: list[str] = []
    given: set[str] = set()
    for entry in entries:
        head, eq, value = entry.partition("=")
        mode, comma, setting = head.rpartition(",")
        if not eq or not setting:
            raise FlagError(f"--trace-config option format is '[<mode>,]<setting>=<value>'. Got {entry}")
        if comma and mode not in TRACE_MODES:
            raise FlagError(f"--trace-config: unknown trace mode '{mode}' (expected triton or opentelemetry)")
        if not comma:
            if setting == "level":
                if value.lower() not in TRACE_LEVELS:
                    raise FlagError(f"--trace-config level: invalid value '{value}' (OFF, TIMESTAMPS or TENSORS)")
                levels.append(TRACE_LEVELS[value.lower()])
            elif setting == "rate":
                cfg["rate"] = _uint(value, "rate")
            elif setting == "count":
                cfg["count"] = _uint(value, "count", -1)
            elif setting == "mode":
                if value not in TRACE_MODES:
                    raise FlagError(f"--trace-config mode: invalid value '{value}' (triton or opentelemetry)")
                cfg["mode"] = value
            else:
                raise FlagError(f"--trace-config: unknown global setting '{setting}' (level, rate, count, mode)")
        elif mode == "triton":
            if setting == "file":
                cfg["file"] = value         # as given, as the trace API reports it (the broker shares our cwd)
            elif setting == "log-frequency":
                cfg["log_frequency"] = _uint(value, "log-frequency")
            else:
                raise FlagError(f"--trace-config: unknown triton setting '{setting}' (file, log-frequency)")
        else:
            otel = cfg["otel"]
            if setting == "url":
                otel["url"] = value         # as given, as the trace API reports it (the exporter adds http://)
            elif setting == "resource":
                key, eq2, val = value.partition("=")
                if not eq2 or not key:
                    raise FlagError(f"--trace-config opentelemetry,resource expects <key>=<value>, got '{value}'")
                otel["resource"][key] = val
            elif setting in BSP_SETTINGS:
                otel[setting] = _bsp(value, f'"--trace-config opentelemetry,{setting}"')
                given.add(setting)
            else:
                raise FlagError(f"--trace-config: unknown opentelemetry setting '{setting}' (url, resource, "
                                f"bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)")
    if levels:
        cfg["level"] = "TIMESTAMPS" if "TIMESTAMPS" in levels else "OFF"
        cfg["tensors"] = "TENSORS" in levels
    if cfg["tensors"] and cfg["mode"] == "opentelemetry":
        raise FlagError("--trace-config level=TENSORS is not supported in opentelemetry mode (as in tritonserver, "
                        "which traces tensors in mode triton only)")
    if cfg["mode"] == "opentelemetry" or any(e.startswith("opentelemetry,") for e in entries):
        import importlib.util
        if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
            raise FlagError("--trace-config mode=opentelemetry needs the OpenTelemetry SDK and its OTLP/HTTP "
                            "exporter: pip install 'tritond[otel]'")
    otel = cfg["otel"]
    if cfg["mode"] == "opentelemetry":
        # as in tritonserver, the batch span processor's settings not given take OTEL_BSP_* from
        # the environment
        for setting in BSP_SETTINGS:
            env = f"OTEL_{setting.upper()}"
            if setting not in given and os.environ.get(env) is not None:
                otel[setting] = _bsp(os.environ[env], f'"{env}"')
    return cfg


def cache_settings(entries: list[str], deprecated_size: int | None) -> int:
    """`--cache-config local,size=<bytes>`: the response cache's size (0: no cache)."""
    if entries and deprecated_size is not None:
        raise FlagError("Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                        "Please provide one or the other.")
    if deprecated_size is not None:
        if deprecated_size < 0:
            raise FlagError("--response-cache-byte-size must be a non-negative number of bytes")
        return deprecated_size
    if len({e.partition(",")[0] for e in entries if "," in e}) > 1:
        # tritonserver checks this before it creates any cache (core src/server.cc)
        raise FlagError("found multiple cache configurations, but only a single cache is currently supported")
    size = 0
    for entry in entries:
        name, comma, rest = entry.partition(",")
        setting, eq, value = rest.partition("=")
        if not comma or not name:
            raise FlagError(f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
                            f"Got {entry}")
        if not eq or not setting or not value:
            raise FlagError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {entry}")
        if name != "local":
            raise FlagError(f"--cache-config: cache '{name}' is not supported by tritond (only 'local')")
        if setting != "size":
            raise FlagError(f"--cache-config: unknown setting '{setting}' for the local cache (size)")
        if not value.strip().isdigit():
            raise FlagError(f"--cache-config local,size expects a number of bytes, got '{value}'")
        size = int(value)
    return size
