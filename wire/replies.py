"""What the broker answers to a control operation (`ControlReply.result`), as typed Structs.

Each answer is one tagged Struct, so a frontend decodes exactly the shape the broker built and
reads fields, not dict keys agreed by their spelling. The answers a frontend serves as a body
(statistics, repository index, shared-memory status, log and trace settings) hold Structs
named and shaped as Triton's messages and are not array-like: `msgspec.to_builtins` renders
them as the HTTP JSON body and as the dict gRPC's json_format parses, so the frontends
translate nothing. The metrics snapshot is the broker's counters for the metrics endpoint,
which turns them into Prometheus families.
"""
from __future__ import annotations

from typing import Union

import msgspec


class _Reply(msgspec.Struct, array_like=True, omit_defaults=True):
    pass


# ---------------------------------------------------------------- statistics (ModelStatistics)

class StatisticDuration(msgspec.Struct):
    count: int = 0
    ns: int = 0


class InferStatistics(msgspec.Struct):
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration
    cache_miss: StatisticDuration


class InferBatchStatistics(msgspec.Struct):
    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class InferResponseStatistics(msgspec.Struct):
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    success: StatisticDuration
    fail: StatisticDuration
    empty_response: StatisticDuration
    cancel: StatisticDuration


class MemoryUsage(msgspec.Struct):
    type: str
    id: int
    byte_size: int


class PagingStatistics(msgspec.Struct):
    """A pageable model's paging (--model-control-mode=paged): in the HTTP statistics only."""
    resident: bool
    page_ins: int
    page_outs: int
    first_response_count: int        # page-ins whose first request was answered
    first_response_ns: int           # their time from that request's arrival to its answer, summed
    memory_bytes: int                # its workers' PSS when last resident (0: never measured)
    last_failure: str = ""           # why its last load failed


class ModelStatistics(msgspec.Struct):
    """One model version's statistics; tritond counts neither per-response statistics nor
    memory usage, which stay empty (Triton's body has them)."""
    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    response_stats: dict[str, InferResponseStatistics] = {}
    batch_stats: list[InferBatchStatistics] = []
    memory_usage: list[MemoryUsage] = []


class StatsReply(_Reply, tag="stats"):
    model_stats: list[ModelStatistics]
    paging: dict[str, PagingStatistics] = {}     # by model name, in paged mode (HTTP renders it)


# ---------------------------------------------------------------- repository index

class ModelIndex(msgspec.Struct, omit_defaults=True):
    """One index entry as Triton lists it: a model without loaded versions has its name only;
    a version has its number (a string), its state and, when there is one, the reason."""
    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


class IndexReply(_Reply, tag="index"):
    models: list[ModelIndex]


# ---------------------------------------------------------------- shared-memory status

class SystemRegionStatus(msgspec.Struct):
    name: str
    key: str
    offset: int
    byte_size: int


class CudaRegionStatus(msgspec.Struct):
    name: str
    device_id: int
    byte_size: int


class ShmStatusReply(_Reply, tag="shm_status"):
    regions: list[SystemRegionStatus]


class CudaStatusReply(_Reply, tag="cuda_status"):
    regions: list[CudaRegionStatus]


# ---------------------------------------------------------------- settings

class LogSettingValues(msgspec.Struct):
    log_file: str
    log_info: bool
    log_warning: bool
    log_error: bool
    log_verbose_level: int
    log_format: str


class LogSettingsReply(_Reply, tag="log_settings"):
    settings: LogSettingValues


class TraceSettingsReply(_Reply, tag="trace_settings"):
    """Strings, as Triton answers them (the level is a list), in its order: the keys depend on
    the mode (a trace file and log frequency, or the opentelemetry settings)."""
    settings: dict[str, str | list[str]]


class DrainReply(_Reply, tag="drained"):
    drained: bool           # nothing was in flight when it ended (False: the exit timeout cancelled it)


# ---------------------------------------------------------------- the metrics snapshot

class SummarySnapshot(_Reply):
    """A latency summary (µs): cumulative count and sum, (quantile, value) over its window."""
    count: int
    sum: float
    quantiles: list[tuple[float, float]]


class HistogramSnapshot(_Reply):
    """Per-bucket (not cumulative) counts; the last bucket is +Inf's."""
    bounds: list[float]
    counts: list[int]
    sum: float


class LatencySummaries(_Reply):
    request: SummarySnapshot
    queue: SummarySnapshot
    compute_input: SummarySnapshot
    compute_infer: SummarySnapshot
    compute_output: SummarySnapshot
    cache_hit: SummarySnapshot
    cache_miss: SummarySnapshot


class WorkerProcess(_Reply):
    instance: str
    pid: int


class ModelSnapshot(_Reply):
    """One model version's counters (durations in ns) and gauges."""
    name: str
    version: int
    tags: dict[str, str]            # the config's metric_tags: labels `_<tag>`
    success: int
    failures: dict[str, int]        # per reason of nv_inference_request_failure
    inference_count: int
    execution_count: int
    request_ns: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    cache: bool                     # the response cache serves this model
    cache_hits: int
    cache_hit_ns: int
    cache_misses: int
    cache_miss_ns: int
    pending: int
    instances_ready: int
    restarts: int
    workers: list[WorkerProcess]
    load_duration_s: float | None = None
    summaries: LatencySummaries | None = None           # --metrics-config summary_latencies
    first_response: HistogramSnapshot | None = None     # --metrics-config histogram_latencies
    retries: int = 0                # requests run again after their worker died (idempotent models)
    retry_failures: int = 0         # retried requests that failed after all


class Peer(_Reply):
    role: str               # http | grpc | supervisor | template
    pid: int


class CacheUsage(_Reply):
    size: int
    used: int
    entries: int
    evictions: int
    insertions: int
    lookups: int
    hits: int


class ModelPaging(_Reply):
    name: str
    resident: bool
    page_ins: int
    page_outs: int
    first_response_count: int
    first_response_ns: int
    memory_bytes: int
    gpu_memory: dict[int, int] = {}         # GPU id -> bytes its workers held there when last measured


class PagingSnapshot(_Reply):
    """The memory budget and what paging did (--model-control-mode=paged)."""
    budget: int
    used: int
    server: int         # of `used`: the server's own processes and its pinned models
    resident: int
    first_response: SummarySnapshot      # µs from a paging-in request's arrival to its answer
    models: list[ModelPaging]
    gpus: dict[int, tuple[int, int]] = {}  # GPU id -> (its --model-gpu-memory-budget, bytes used there)


class CustomMetric(_Reply):
    labels: dict[str, str]
    value: float = 0.0
    histogram: HistogramSnapshot | None = None


class CustomFamily(_Reply):
    """A family the models made (pb_utils.MetricFamily)."""
    name: str
    description: str
    kind: str               # counter, gauge or histogram
    metrics: list[CustomMetric]


class MetricsReply(_Reply, tag="metrics"):
    """Everything one scrape reports, taken in one turn of the broker's loop."""
    models: list[ModelSnapshot]
    broker_pid: int
    peers: list[Peer]
    queued: int
    inflight_batches: int
    cache: CacheUsage | None = None
    paging: PagingSnapshot | None = None
    custom: list[CustomFamily] = []


class ReadyReply(_Reply, tag="ready"):
    ready: bool


class MetricId(_Reply, tag="metric_id"):
    id: int


class MetricValue(_Reply, tag="metric_value"):
    value: float


# A load, an unload, a region's registration, a log reopen and a stop answer None.
ControlResult = Union[IndexReply, StatsReply, MetricsReply, ShmStatusReply, CudaStatusReply, LogSettingsReply,
                      TraceSettingsReply, DrainReply, ReadyReply, MetricId, MetricValue, None]
