"""Per-model-version statistics in Triton's shape (GET /v2/models/{m}/stats, ModelStatistics).

What counts where, as Triton's core and backends count it:
- a request that succeeds: `success` (count, arrival to answer), `queue` (arrival to
  dispatch), `compute_input/infer/output` (its batch's durations, once per request) and
  `inference_count` += its own batch size;
- a request that fails after admission (backend error, worker death, queue timeout):
  `fail` only; a request refused at admission ("Exceeds maximum queue size") counts nowhere;
- an execution: `execution_count` += 1, `batch_stats[total batch size]`, `last_inference`;
- a response cache hit: `success`, `queue` and `cache_hit` (lookup time), no inference or
  execution; a miss: `cache_miss` (lookup and insertion time), which is also added to the
  request's duration.
Failures are counted per Triton's reasons for `nv_inference_request_failure`. When latency
summaries or the first-response histogram are on (`--metrics-config`), `latency` observes
each request as well (broker/observe/metrics.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tritond.wire import replies as R

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def statistic(self) -> R.StatisticDuration:
        return R.StatisticDuration(self.count, self.ns)


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    name: str
    version: int
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)
    restarts: int = 0
    retries: int = 0                # requests run again after their worker died
    retry_failures: int = 0         # of those, the ones that failed after all
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    latency: Any = None             # observer of latency summaries / histograms (--metrics-config)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution of `batch_size` elements (the sum over its requests)."""
        self.execution_count += 1
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStat()
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        self.last_inference_ms = max(self.last_inference_ms, int(time.time() * 1000))

    def record_success(self, batch_size: int, total_ns: int, queue_ns: int,
                       input_ns: int, infer_ns: int, output_ns: int, first_response: bool = True) -> None:
        """One request answered with outputs; compute times are its batch's."""
        self.inference_count += batch_size
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)
        if self.latency is not None:
            self.latency.success(total_ns, queue_ns, input_ns, infer_ns, output_ns, first_response)

    def record_cache_hit(self, total_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """One request answered from the response cache, without executing."""
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(lookup_ns)
        if self.latency is not None:
            self.latency.cache_hit(total_ns, queue_ns, lookup_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A cacheable request that executed: lookup plus insertion time, which Triton also
        adds to the request's duration."""
        self.cache_miss.add(miss_ns)
        self.success.ns += miss_ns
        if self.latency is not None:
            self.latency.cache_miss(miss_ns)

    def record_ensemble(self, batch_size: int, total_ns: int) -> None:
        """One ensemble request answered with outputs, an execution of its own batch size as
        Triton counts it (its steps were counted by their models; its first answer was timed
        when it went out)."""
        self.record_execution(batch_size, 0, 0, 0)
        self.record_success(batch_size, total_ns, 0, 0, 0, 0, first_response=False)

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        """One admitted request answered with an error, for one of FAILURE_REASONS."""
        self.fail.add(total_ns)
        self.failures[reason] += 1

    def statistics(self) -> R.ModelStatistics:
        """The version's statistics as the statistics API answers them."""
        return R.ModelStatistics(
            name=self.name, version=str(self.version), last_inference=self.last_inference_ms,
            inference_count=self.inference_count, execution_count=self.execution_count,
            inference_stats=R.InferStatistics(
                success=self.success.statistic(), fail=self.fail.statistic(), queue=self.queue.statistic(),
                compute_input=self.compute_input.statistic(), compute_infer=self.compute_infer.statistic(),
                compute_output=self.compute_output.statistic(), cache_hit=self.cache_hit.statistic(),
                cache_miss=self.cache_miss.statistic()),
            batch_stats=[R.InferBatchStatistics(bs, b.compute_input.statistic(), b.compute_infer.statistic(),
                                                b.compute_output.statistic())
                         for bs, b in sorted(self.batches.items())],
        )
