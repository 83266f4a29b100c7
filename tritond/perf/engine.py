"""The measuring engine of `tritond perf`: keeps a concurrency level or a request rate on the
server and measures it the way perf_analyzer does.

Measurement follows perf_analyzer's rules so that both give the same numbers: back-to-back
windows of `--measurement-interval`; a request counts in the window its response arrived
in; a level is stable when, over the last 3 windows, max/min of the throughput and of the
stabilizing latency (the average, or the `--percentile` latency) are both within
`--stability-percentage`; at most `--max-trials` windows; the reported figures merge those
last 3 windows (all their latencies pooled, throughput = requests x batch / total time).
Server-side figures are deltas of the statistics API read at each window boundary.

Where perf_analyzer stops with an error after `--max-trials` unstable windows, this engine
still reports the last 3 windows, marked unstable, so a sweep on a noisy host goes on.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .control import Control, ControlError
from .loadgen import Driver

STABILITY_WINDOW = 3
PERCENTILES = (50, 90, 95, 99)


class MeasureError(RuntimeError):
    """Measuring could not start or produced nothing (every request failed, for instance)."""


@dataclass
class ServerStats:
    """Counters of one model version's statistics, or the difference of two readings."""

    success_count: int = 0
    success_ns: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_input_count: int = 0
    compute_input_ns: int = 0
    compute_infer_count: int = 0
    compute_infer_ns: int = 0
    compute_output_count: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    execution_infer_ns: int = 0      # compute infer summed once per execution (batch_stats)
    batches: dict[int, int] = field(default_factory=dict)   # batch size -> executions

    _FIELDS = ("success", "queue", "compute_input", "compute_infer", "compute_output")

    @classmethod
    def from_json(cls, entry: dict) -> "ServerStats":
        stats = entry.get("inference_stats", {})
        out = cls(inference_count=int(entry.get("inference_count", 0)),
                  execution_count=int(entry.get("execution_count", 0)))
        for name in cls._FIELDS:
            d = stats.get(name, {})
            setattr(out, f"{name}_count", int(d.get("count", 0)))
            setattr(out, f"{name}_ns", int(d.get("ns", 0)))
        for b in entry.get("batch_stats", []):
            infer = b.get("compute_infer", {})
            out.batches[int(b["batch_size"])] = int(infer.get("count", 0))
            out.execution_infer_ns += int(infer.get("ns", 0))
        return out

    def _combine(self, other: "ServerStats", sign: int) -> "ServerStats":
        out = ServerStats()
        for name in [*(f"{f}_{k}" for f in self._FIELDS for k in ("count", "ns")), "inference_count", "execution_count",
                     "execution_infer_ns"]:
            setattr(out, name, getattr(self, name) + sign * getattr(other, name))
        for size in set(self.batches) | set(other.batches):
            n = self.batches.get(size, 0) + sign * other.batches.get(size, 0)
            if n:
                out.batches[size] = n
        return out

    def __add__(self, other: "ServerStats") -> "ServerStats":
        return self._combine(other, 1)

    def __sub__(self, other: "ServerStats") -> "ServerStats":
        return self._combine(other, -1)

    @staticmethod
    def _avg(ns: int, count: int) -> int:
        return ns // count if count > 0 else 0

    @property
    def avg_queue_ns(self) -> int:
        return self._avg(self.queue_ns, self.queue_count)

    @property
    def avg_compute_input_ns(self) -> int:
        return self._avg(self.compute_input_ns, self.compute_input_count)

    @property
    def avg_compute_infer_ns(self) -> int:
        return self._avg(self.compute_infer_ns, self.compute_infer_count)

    @property
    def avg_compute_output_ns(self) -> int:
        return self._avg(self.compute_output_ns, self.compute_output_count)

    @property
    def avg_compute_ns(self) -> int:
        """All three compute phases over the compute count, as perf_analyzer sums them."""
        return self._avg(self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns,
                         self.compute_input_count)

    @property
    def avg_request_ns(self) -> int:
        return self._avg(self.success_ns, self.success_count)

    @property
    def infer_ns_per_inference(self) -> float:
        """Model execution time per inference: what batching buys."""
        return self.execution_infer_ns / self.inference_count if self.inference_count else 0.0

    @property
    def avg_batch_size(self) -> float:
        return self.inference_count / self.execution_count if self.execution_count else 0.0


@dataclass
class LevelResult:
    """One concurrency level or request rate, merged over its last (stable) windows."""

    mode: str                  # "concurrency" | "request_rate"
    level: float
    batch_size: int
    request_count: int
    duration_ns: int
    infer_per_sec: float
    avg_latency_ns: int
    std_us: int
    percentiles_ns: dict[int, int]
    avg_send_ns: int
    avg_recv_ns: int
    server: ServerStats | None
    stable: bool
    windows: int
    errors: int = 0
    delayed: int = 0
    last_error: str = ""

    def latency_ns(self, percentile: int) -> int:
        """The stabilizing latency: the given percentile, or the average for -1."""
        return self.avg_latency_ns if percentile < 0 else self.percentiles_ns[percentile]


@dataclass
class Window:
    samples: list[tuple[int, int, int, int]]   # (end_ns, latency_ns, send_ns, recv_ns)
    duration_ns: int
    server: ServerStats | None
    errors: int
    delayed: int


def percentile_index(p: float, n: int) -> int:
    """perf_analyzer's rank: round p% of the way through n sorted samples."""
    return int(p / 100.0 * (n - 1) + 0.5)


def summarize(windows: Sequence[Window], mode: str, level: float, batch_size: int, percentile: int,
              stable: bool, windows_run: int, last_error: str = "") -> LevelResult:
    latencies = sorted(s[1] for w in windows for s in w.samples)
    if not latencies:
        raise MeasureError("no request completed within the measurement windows"
                           + (f" (last error: {last_error})" if last_error else "; use a larger --measurement-interval"))
    count = len(latencies)
    duration = sum(w.duration_ns for w in windows)
    wanted = sorted(set(PERCENTILES) | ({percentile} if percentile > 0 else set()))
    avg = sum(latencies) // count
    mean_sq_us = sum((x // 1000) ** 2 for x in latencies) // count
    servers = [w.server for w in windows]
    server = None
    if all(s is not None for s in servers):
        server = ServerStats()
        for s in servers:
            server = server + s
    return LevelResult(
        mode=mode, level=level, batch_size=batch_size, request_count=count, duration_ns=duration,
        infer_per_sec=count * batch_size / (duration / 1e9),
        avg_latency_ns=avg,
        std_us=int(max(mean_sq_us - (avg // 1000) ** 2, 0) ** 0.5),
        percentiles_ns={p: latencies[percentile_index(p, count)] for p in wanted},
        avg_send_ns=sum(s[2] for w in windows for s in w.samples) // count,
        avg_recv_ns=sum(s[3] for w in windows for s in w.samples) // count,
        server=server, stable=stable, windows=windows_run,
        errors=sum(w.errors for w in windows), delayed=sum(w.delayed for w in windows), last_error=last_error)


def is_stable(points: Sequence[tuple[float, float]], threshold: float) -> bool:
    """perf_analyzer's test over the last 3 (throughput, latency) points: max/min within 1 + threshold."""
    if len(points) < STABILITY_WINDOW:
        return False
    last = points[-STABILITY_WINDOW:]
    if any(t <= 0 or lat <= 0 for t, lat in last):
        return False
    ths, lats = [t for t, _ in last], [lat for _, lat in last]
    return max(ths) / min(ths) <= 1 + threshold and max(lats) / min(lats) <= 1 + threshold


@dataclass(frozen=True)
class MeasureOptions:
    interval_s: float = 5.0
    stability: float = 0.10
    max_trials: int = 10
    percentile: int = -1
    batch_size: int = 1


def _server_reading(control: Control | None, model: str, version: str) -> ServerStats | None:
    if control is None:
        return None
    try:
        entries = control.model_stats(model, version)
    except ControlError:
        return None
    if not entries:
        return None
    entry = max(entries, key=lambda e: int(e.get("version") or 0))
    return ServerStats.from_json(entry)


WindowCallback = Callable[[int, int, float, float, bool], None]   # (window, max, infer/s, latency ns, stable)


async def measure_level(driver: Driver, mode: str, level: float, opts: MeasureOptions,
                        control: Control | None, model: str, version: str = "",
                        poisson: bool = False, on_window: WindowCallback | None = None) -> LevelResult:
    """Put one level of load on the server and measure it until stable (or `max_trials`)."""
    reading = await asyncio.to_thread(_server_reading, control, model, version)
    if mode == "concurrency":
        await driver.start(concurrency=int(level))
    else:
        await driver.start(rate=level, poisson=poisson)
    try:
        driver.take()
        window_start = time.perf_counter_ns()
        windows: deque[Window] = deque(maxlen=STABILITY_WINDOW)
        points: list[tuple[float, float]] = []
        stable = False
        run = 0
        for run in range(1, opts.max_trials + 1):
            await asyncio.sleep(opts.interval_s)
            samples, errors, delayed = driver.take()
            window_end = time.perf_counter_ns()
            new_reading = await asyncio.to_thread(_server_reading, control, model, version)
            server = new_reading - reading if new_reading is not None and reading is not None else None
            reading = new_reading
            inside = [s for s in samples if window_start <= s[0] <= window_end]
            windows.append(Window(inside, window_end - window_start, server, errors, delayed))
            window_start = window_end
            if inside:
                lats = sorted(s[1] for s in inside)
                lat = sum(lats) / len(lats) if opts.percentile < 0 else lats[percentile_index(opts.percentile, len(lats))]
                points.append((len(inside) * opts.batch_size / ((windows[-1].duration_ns) / 1e9), lat))
            else:
                points.append((0.0, 0.0))
            stable = is_stable(points, opts.stability)
            if on_window is not None:
                on_window(run, opts.max_trials, points[-1][0], points[-1][1], stable)
            if stable:
                break
    finally:
        await driver.stop()
    return summarize(windows, mode, level, opts.batch_size, opts.percentile, stable, run, driver.last_error)
