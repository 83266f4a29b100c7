"""What /metrics reads: the broker's counters, in one snapshot per scrape.

The broker is the one source of truth (DESIGN §10): every request is admitted, answered and
counted here, so counts are exact across any number of frontend and worker processes, and a
model's series come and go with its model version (they appear at load, all zero, and go at
unload). prometheus_client's multiprocess mode would instead need a file per process and
metric in a shared directory, cannot drop a model's series at unload, and has no live
summaries. The metrics frontend renders the snapshot with prometheus_client objects.

Latency summaries and the first-response histogram (`--metrics-config`) observe each request
here as well: a summary keeps its cumulative count and sum and a window of the latest
observations, whose quantiles are computed at scrape time (the window is what Triton's
summaries slide over: recent requests, not all time).
"""
from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable, Iterable

from tritond.wire import replies as R
from tritond.wire.options import MetricsConfig

from tritond.repository.model_metrics import first_response_buckets

from tritond.broker.tables.model_version import READY, ModelVersion

NS_PER_US = 1000
NS_PER_MS = 1_000_000
SUMMARY_WINDOW = 4096
FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
PAGING_QUANTILES = [0.5, 0.9, 0.99]
SUMMARIES = ("request", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


class Summary:
    __slots__ = ("count", "sum", "window")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.window: deque[float] = deque(maxlen=SUMMARY_WINDOW)

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self.window.append(value)

    def snapshot(self, quantiles: Iterable[float]) -> R.SummarySnapshot:
        data = sorted(self.window)
        qs = [(q, data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")) for q in quantiles]
        return R.SummarySnapshot(self.count, self.sum, qs)


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = 0
        for b in self.bounds:
            if value <= b:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value

    def snapshot(self) -> R.HistogramSnapshot:
        return R.HistogramSnapshot(list(self.bounds), list(self.counts), self.sum)


class Latencies:
    """One model version's summaries (µs) and first-response histogram (whole ms, as Triton
    observes it: clients parse its sum as an integer), as enabled."""

    def __init__(self, summaries: bool, histogram: bool, buckets: tuple[float, ...] | None = None) -> None:
        self.summaries = {name: Summary() for name in SUMMARIES} if summaries else None
        self.first_response = Histogram(buckets or FIRST_RESPONSE_BUCKETS_MS) if histogram else None

    def success(self, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int,
                first_response: bool = True) -> None:
        """A request answered; `first_response` is False for a decoupled one (timed at its first
        response instead)."""
        s = self.summaries
        if s is not None:
            s["request"].observe(total_ns / NS_PER_US)
            s["queue"].observe(queue_ns / NS_PER_US)
            s["compute_input"].observe(input_ns / NS_PER_US)
            s["compute_infer"].observe(infer_ns / NS_PER_US)
            s["compute_output"].observe(output_ns / NS_PER_US)
        if self.first_response is not None and first_response:
            self.first_response.observe(total_ns // NS_PER_MS)

    def cache_hit(self, total_ns: int, queue_ns: int, lookup_ns: int) -> None:
        s = self.summaries
        if s is not None:
            s["queue"].observe(queue_ns / NS_PER_US)
            s["cache_hit"].observe(lookup_ns / NS_PER_US)
        if self.first_response is not None:
            self.first_response.observe(total_ns // NS_PER_MS)

    def cache_miss(self, miss_ns: int) -> None:
        if self.summaries is not None:
            self.summaries["cache_miss"].observe(miss_ns / NS_PER_US)

    def first_response_ms(self, ms: int) -> None:
        """A decoupled model's first response (its request's later responses do not count)."""
        if self.first_response is not None:
            self.first_response.observe(ms)

    def summaries_snapshot(self, quantiles: Iterable[float]) -> R.LatencySummaries | None:
        if self.summaries is None:
            return None
        qs = list(quantiles)
        return R.LatencySummaries(**{k: v.snapshot(qs) for k, v in self.summaries.items()})

    def first_response_snapshot(self) -> R.HistogramSnapshot | None:
        return self.first_response.snapshot() if self.first_response is not None else None


def latency_factory(cfg: MetricsConfig) -> Callable[[dict[str, Any] | None], Latencies] | None:
    """What broker/observe/stats.py builds per model version from its config (whose model_metrics
    may set the first-response buckets), or None when nothing is observed."""
    summaries = cfg.summary_latencies
    histogram = cfg.histogram_latencies
    if not summaries and not histogram:
        return None
    return lambda config: Latencies(summaries, histogram, first_response_buckets(config) if histogram else None)


def reported(mv: ModelVersion) -> bool:
    """A version has series once it has loaded, until it is unloaded (a version whose workers
    are restarting keeps them)."""
    return mv.state is READY or (mv.scheduler is not None and not mv.unloaded)


def model_snapshot(mv: ModelVersion, quantiles: Iterable[float], cache_on: bool) -> R.ModelSnapshot:
    s = mv.stats
    config = mv.config or {}
    latency = s.latency
    return R.ModelSnapshot(
        name=mv.name, version=mv.version,
        tags={str(k): str(v) for k, v in (config.get("metric_tags") or {}).items()},
        success=s.success.count, failures=dict(s.failures),
        inference_count=s.inference_count, execution_count=s.execution_count,
        request_ns=s.success.ns, queue_ns=s.queue.ns, compute_input_ns=s.compute_input.ns,
        compute_infer_ns=s.compute_infer.ns, compute_output_ns=s.compute_output.ns,
        cache=cache_on,
        cache_hits=s.cache_hit.count, cache_hit_ns=s.cache_hit.ns,
        cache_misses=s.cache_miss.count, cache_miss_ns=s.cache_miss.ns,
        pending=len(mv.scheduler) if mv.scheduler else 0,
        instances_ready=len(mv.serving()),
        restarts=s.restarts, retries=s.retries, retry_failures=s.retry_failures,
        workers=[R.WorkerProcess(i.name, i.pid) for i in mv.instances if i.pid and i.serving],
        load_duration_s=round(mv.load_duration, 6) if mv.load_duration else None,
        summaries=latency.summaries_snapshot(quantiles) if latency is not None else None,
        first_response=latency.first_response_snapshot() if latency is not None else None,
    )


def snapshot(broker: Any) -> R.MetricsReply:
    """Everything one scrape reports, taken in one turn of the broker's loop."""
    quantiles = [q for q, _ in broker.opts.metrics.summary_quantiles]
    models = []
    queued = 0
    for mv in broker.registry.versions():
        if mv.scheduler is not None:
            queued += len(mv.scheduler)
        if reported(mv):
            models.append(model_snapshot(mv, quantiles, bool(mv.view.response_cache)))
    peers = [R.Peer(kind, pid) for ident, (kind, pid) in broker.peers.items() if ident in broker.frontends]
    peers += [R.Peer("template", pid) for pid in broker.pool.templates.pids()]
    pager = broker.model_ops.pager
    return R.MetricsReply(models, os.getpid(), peers, queued, len(broker.inflight),
                          broker.cache.usage() if broker.cache.enabled else None,
                          pager.snapshot(PAGING_QUANTILES) if pager is not None else None,
                          broker.custom_metrics.snapshot())
