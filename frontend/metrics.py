"""Prometheus metrics with Triton's names, labels, types and units, from the broker's snapshot.

Each scrape asks the broker for one snapshot of its counters (broker/observe/metrics.py: the one
source of truth across processes) and builds prometheus_client metric families from it:
Triton's per-model families (labels `model`, `version` and `_<tag>` for each config
`metric_tags` entry), the latency counters, summaries and first-response histogram that
`--metrics-config` selects, the response cache's per-model families, `nv_cpu_*` (the host's,
as Triton reports them) and `nv_gpu_*` through NVML when GPUs exist, and tritond's own:
worker restarts and ready instances, the process tree's CPU and resident memory (per role
and per worker), shared memory in use, the broker's queue and in-flight batches, the
round trip of the scrape's request to the broker, and the cache's usage.

The text is written in the Prometheus text format as Triton (prometheus-cpp) writes it:
prometheus_client's own writer renames every counter to `<name>_total` and prints integers as
`5.0`, which would break every Triton dashboard and alert (`nv_inference_request_success`),
so `exposition` writes the families with prometheus_client's escaping rules but Triton's names
and number format. Host figures (`nv_cpu_*`, the tree's CPU use, GPUs) are polled every
`--metrics-interval-ms`; the rest is read at scrape time.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from typing import Any, Callable, Iterable

from prometheus_client import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from tritond.wire import replies as R
from tritond.wire.options import MetricsConfig, ServerOptions
from tritond.wire.schema import ModelMetrics

log = logging.getLogger("tritond.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NS = 1000     # ns per µs
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# (family, its counter in a model's snapshot, help)
LATENCY_COUNTERS: list[tuple[str, Callable[[R.ModelSnapshot], int], str]] = [
    ("nv_inference_request_duration_us", lambda m: m.request_ns,
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", lambda m: m.queue_ns,
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", lambda m: m.compute_input_ns,
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", lambda m: m.compute_infer_ns,
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", lambda m: m.compute_output_ns,
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
]
# (family, its summary, help, with the cache: True only with it, False only without it, None either way)
SUMMARIES: list[tuple[str, Callable[[R.LatencySummaries], R.SummarySnapshot], str, bool | None]] = [
    ("nv_inference_request_summary_us", lambda s: s.request, "Summary of inference request duration in "
                                                             "microseconds (includes cached requests)", False),
    ("nv_inference_queue_summary_us", lambda s: s.queue, "Summary of inference queuing duration in microseconds "
                                                         "(includes cached requests)", None),
    ("nv_inference_compute_input_summary_us", lambda s: s.compute_input, "Summary of compute input duration in "
                                                                         "microseconds (does not include cached "
                                                                         "requests)", None),
    ("nv_inference_compute_infer_summary_us", lambda s: s.compute_infer, "Summary of compute inference duration "
                                                                         "in microseconds (does not include "
                                                                         "cached requests)", None),
    ("nv_inference_compute_output_summary_us", lambda s: s.compute_output, "Summary of inference compute output "
                                                                           "duration in microseconds (does not "
                                                                           "include cached requests)", None),
    ("nv_cache_hit_summary_per_model", lambda s: s.cache_hit, "Summary of cache hit counts/durations per model, "
                                                              "in microseconds", True),
    ("nv_cache_miss_summary_per_model", lambda s: s.cache_miss, "Summary of cache miss counts/durations per "
                                                                "model, in microseconds", True),
]


# ---------------------------------------------------------------------------- exposition

def _value(v: float) -> str:
    """A number as prometheus-cpp prints it: integers without a fraction."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e16:
        return str(int(v))
    return format(v, ".16g")


def _escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _label_order(item: tuple[str, Any]) -> tuple[bool, str]:
    """prometheus-cpp's order: a series' labels by name, then a bucket's `le` or a summary's
    `quantile` (text scrapers such as Triton's qa tests match whole series keys)."""
    return item[0] in ("le", "quantile"), item[0]


def exposition(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4) of prometheus_client metric families."""
    out = []
    for m in families:
        doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {m.name} {doc}\n")
        out.append(f"# TYPE {m.name} {'untyped' if m.type == 'unknown' else m.type}\n")
        for s in m.samples:
            labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(s.labels.items(), key=_label_order))
            out.append(f"{s.name}{{{labels}}} {_value(s.value)}\n" if labels else f"{s.name} {_value(s.value)}\n")
    return "".join(out).encode()


class Families:
    """Families by name, in first-use order; each sample added with its labels."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def family(self, name: str, kind: str, doc: str) -> Metric:
        m = self.by_name.get(name)
        if m is None:
            m = self.by_name[name] = Metric(name, doc, kind)
        return m

    def add(self, name: str, kind: str, doc: str, labels: dict[str, str], value: float) -> None:
        self.family(name, kind, doc).add_sample(name, labels, float(value))

    def summary(self, name: str, doc: str, labels: dict[str, str], data: R.SummarySnapshot) -> None:
        m = self.family(name, "summary", doc)
        for q, v in data.quantiles:
            m.add_sample(name, {**labels, "quantile": _value(q)}, float(v))
        m.add_sample(name + "_sum", labels, float(data.sum))
        m.add_sample(name + "_count", labels, float(data.count))

    def histogram(self, name: str, doc: str, labels: dict[str, str], data: R.HistogramSnapshot) -> None:
        m = self.family(name, "histogram", doc)
        cumulative = 0
        for bound, count in zip(data.bounds + [math.inf], data.counts):
            cumulative += count
            m.add_sample(name + "_bucket", {**labels, "le": _value(bound)}, float(cumulative))
        m.add_sample(name + "_sum", labels, float(data.sum))
        m.add_sample(name + "_count", labels, float(cumulative))


# ---------------------------------------------------------------------------- per model

def custom_families(f: Families, families: list[R.CustomFamily]) -> None:
    """The families Python models made (pb_utils.MetricFamily), with their own names and labels."""
    for fam in families:
        f.family(fam.name, fam.kind, fam.description)
        for m in fam.metrics:
            if m.histogram is not None:
                f.histogram(fam.name, fam.description, m.labels, m.histogram)
            else:
                f.add(fam.name, fam.kind, fam.description, m.labels, m.value)


def model_families(f: Families, m: R.ModelSnapshot, cfg: MetricsConfig) -> None:
    labels = {"model": m.name, "version": str(m.version)}
    labels.update({"_" + k: v for k, v in m.tags.items()})
    c = "counter"
    f.add("nv_inference_request_success", c, "Number of successful inference requests, all batch sizes",
          labels, m.success)
    for reason, n in m.failures.items():
        f.add("nv_inference_request_failure", c, "Number of failed inference requests, all batch sizes",
              {**labels, "reason": reason}, n)
    f.add("nv_inference_count", c, "Number of inferences performed (does not include cached requests)",
          labels, m.inference_count)
    f.add("nv_inference_exec_count", c, "Number of model executions performed (does not include cached requests)",
          labels, m.execution_count)
    if cfg.counter_latencies:
        for name, counter, doc in LATENCY_COUNTERS:
            f.add(name, c, doc, labels, counter(m) // NS)
        if m.cache:
            f.add("nv_cache_num_hits_per_model", c, "Number of cache hits per model", labels, m.cache_hits)
            f.add("nv_cache_num_misses_per_model", c, "Number of cache misses per model", labels, m.cache_misses)
            f.add("nv_cache_hit_duration_per_model", c, "Total cache hit duration per model, in microseconds",
                  labels, m.cache_hit_ns // NS)
            f.add("nv_cache_miss_duration_per_model", c, "Total cache miss (insert+lookup) duration per model, in "
                  "microseconds", labels, m.cache_miss_ns // NS)
    g = "gauge"
    f.add("nv_inference_pending_request_count", g, "Instantaneous number of pending requests awaiting execution "
          "per-model.", labels, m.pending)
    if m.load_duration_s is not None:
        f.add("nv_model_load_duration_secs", g, "Model load time in seconds", labels, m.load_duration_s)
    if m.summaries is not None:
        for name, summary, doc, with_cache in SUMMARIES:
            if with_cache is None or with_cache == m.cache:    # as Triton: no request summary with the cache
                f.summary(name, doc, labels, summary(m.summaries))
    if m.first_response is not None:
        f.histogram("nv_inference_first_response_histogram_ms", "Duration from request to first response in "
                    "milliseconds", labels, m.first_response)
    f.add("tritond_model_restart_count", c, "Number of times a worker of this model was restarted after dying",
          labels, m.restarts)
    f.add("tritond_inference_request_retry", c, "Number of inference requests run again after the worker "
          "executing them died (idempotent models)", labels, m.retries)
    f.add("tritond_inference_request_retry_failure", c, "Number of inference requests that failed after "
          "they were run again", labels, m.retry_failures)
    f.add("tritond_model_ready_instances", g, "Number of instances of this model able to serve",
          labels, m.instances_ready)


# ---------------------------------------------------------------------------- the host and the tree

def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def host_cpu() -> tuple[int, int]:
    """(busy, idle) jiffies of the whole host, as Triton reads /proc/stat."""
    fields = [int(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal, idle + iowait


def host_memory() -> tuple[int, int]:
    """(total, used) bytes: MemTotal and MemTotal - MemAvailable, as Triton reports them."""
    info = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        info[key] = int(rest.split()[0]) * 1024
    return info.get("MemTotal", 0), info.get("MemTotal", 0) - info.get("MemAvailable", 0)


def tree(root: int) -> list[int]:
    """The pids of `root` and all its descendants."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                todo.extend(int(c) for c in _read(f"/proc/{pid}/task/{tid}/children").split())
        except OSError:
            continue
    return out


def process_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of one process; (0, 0) when it is gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
        rss = int(_read(f"/proc/{pid}/statm").split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0.0, 0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, rss


def process_memory(pid: int) -> tuple[int, int]:
    """(PSS, USS) bytes of one process: its share of every page it maps (pages shared with
    N processes count 1/N), and the pages only it maps (what one more such process costs)."""
    pss = uss = 0
    try:
        for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
            key, _, rest = line.partition(":")
            if key == "Pss":
                pss = int(rest.split()[0]) * 1024
            elif key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return 0, 0
    return pss, uss


class Gpus:
    """NVML, when a GPU and nvidia-ml-py are there; otherwise one log line saying why not."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.energy0: list[float] = []
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception as e:  # no package, no driver, no device
            log.info("GPU metrics are off: %s", e or type(e).__name__)
            return
        self.energy0 = [self._energy(h) for h in self.handles]

    def _energy(self, h: Any) -> float:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
        except Exception:
            return 0.0

    def sample(self) -> list[dict[str, Any]]:
        out = []
        n = self.nvml
        for i, h in enumerate(self.handles):
            try:
                uuid = n.nvmlDeviceGetUUID(h)
                mem = n.nvmlDeviceGetMemoryInfo(h)
                out.append({"uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                            "util": n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                            "mem_total": mem.total, "mem_used": mem.used,
                            "power": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                            "power_limit": n.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                            "energy": self._energy(h) - self.energy0[i]})
            except Exception as e:
                log.warning("GPU %d metrics: %s", i, e)
        return out


class HostSampler:
    """Polls what needs an interval: host CPU use and memory, the tree's CPU use, GPUs."""

    def __init__(self, supervisor_pid: int, cpu: bool, gpu: bool) -> None:
        self.root = supervisor_pid
        self.cpu_on = cpu
        self.gpus = Gpus() if gpu else None
        self.cpu = 0.0 if cpu else None
        self.memory = host_memory() if cpu else None
        self.tree_utilization = 0.0
        self.gpu: list[dict[str, Any]] = []
        self._last_host = host_cpu() if cpu else (0, 0)
        self._last_tree = (time.monotonic(), self._tree_seconds())

    def _tree_seconds(self) -> float:
        return sum(process_usage(pid)[0] for pid in tree(self.root))

    def poll(self) -> None:
        if self.cpu_on:
            busy, idle = host_cpu()
            d_busy, d_idle = busy - self._last_host[0], idle - self._last_host[1]
            self._last_host = (busy, idle)
            self.cpu = d_busy / (d_busy + d_idle) if d_busy + d_idle > 0 else 0.0
            self.memory = host_memory()
            now, seconds = time.monotonic(), self._tree_seconds()
            elapsed = now - self._last_tree[0]
            if elapsed > 0:
                self.tree_utilization = max(0.0, seconds - self._last_tree[1]) / (elapsed * (os.cpu_count() or 1))
            self._last_tree = (now, seconds)
        if self.gpus is not None and self.gpus.handles:
            self.gpu = self.gpus.sample()

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await asyncio.to_thread(self.poll)
            except Exception:
                log.exception("polling host metrics failed")
            await asyncio.sleep(interval_s)


def shm_in_use(server_id: str) -> int:
    """Bytes of memory backing this server's shared-memory segments (pages touched)."""
    total = 0
    prefix = f"tritond.{server_id}."
    try:
        with os.scandir("/dev/shm") as entries:
            for e in entries:
                if e.name.startswith(prefix):
                    try:
                        total += e.stat().st_blocks * 512
                    except OSError:
                        pass
    except OSError:
        pass
    return total


def server_families(f: Families, snap: R.MetricsReply, sampler: HostSampler, server_id: str,
                    round_trip_s: float) -> None:
    g, c = "gauge", "counter"
    if sampler.cpu is not None:
        f.add("nv_cpu_utilization", g, "CPU utilization rate [0.0 - 1.0]", {}, sampler.cpu)
        f.add("nv_cpu_memory_total_bytes", g, "CPU total memory (RAM), in bytes", {}, sampler.memory[0])
        f.add("nv_cpu_memory_used_bytes", g, "CPU used memory (RAM), in bytes", {}, sampler.memory[1])
    for gpu in sampler.gpu:
        labels = {"gpu_uuid": gpu["uuid"]}
        f.add("nv_gpu_utilization", g, "GPU utilization rate [0.0 - 1.0)", labels, gpu["util"])
        f.add("nv_gpu_memory_total_bytes", g, "GPU total memory, in bytes", labels, gpu["mem_total"])
        f.add("nv_gpu_memory_used_bytes", g, "GPU used memory, in bytes", labels, gpu["mem_used"])
        f.add("nv_gpu_power_usage", g, "GPU power usage in watts", labels, gpu["power"])
        f.add("nv_gpu_power_limit", g, "GPU power management limit in watts", labels, gpu["power_limit"])
        f.add("nv_energy_consumption", c, "GPU energy consumption in joules since the Triton Server started",
              labels, gpu["energy"])
    roles = {snap.broker_pid: "broker"}
    roles.update({p.pid: p.role for p in snap.peers})
    workers = {w.pid: (m, w.instance) for m in snap.models for w in m.workers}
    if sampler.cpu_on:
        per_role: dict[str, list[float]] = {}
        for pid in tree(sampler.root):
            seconds, rss = process_usage(pid)
            role = "worker" if pid in workers else roles.get(pid, "other")
            acc = per_role.setdefault(role, [0.0, 0])
            acc[0] += seconds
            acc[1] += rss
            if pid in workers:
                m, instance = workers[pid]
                labels = {"model": m.name, "version": str(m.version), "instance": instance}
                f.add("tritond_worker_resident_memory_bytes", g, "Resident memory of a worker process, in bytes",
                      labels, rss)
                pss, uss = process_memory(pid)
                help_text = ("Memory of a worker process, in bytes: pss = its share of every page it maps, "
                             "uss = the pages only it maps (what one more instance costs)")
                f.add("tritond_worker_memory_bytes", g, help_text, dict(labels, type="pss"), pss)
                f.add("tritond_worker_memory_bytes", g, help_text, dict(labels, type="uss"), uss)
        for role, (seconds, rss) in sorted(per_role.items()):
            f.add("tritond_process_cpu_seconds", c, "CPU time used by the server's processes of one role "
                  "(supervisor, broker, http, grpc, openai, worker), in seconds", {"role": role}, round(seconds, 2))
            f.add("tritond_process_resident_memory_bytes", g, "Resident memory of the server's processes of one "
                  "role, in bytes", {"role": role}, rss)
        f.add("tritond_cpu_utilization", g, "CPU used by the server's whole process tree over the last metrics "
              "interval, as a fraction of the host's CPUs [0.0 - 1.0]", {}, sampler.tree_utilization)
    f.add("tritond_shm_bytes_in_use", g, "Memory backing the server's shared-memory segments, in bytes",
          {}, shm_in_use(server_id))
    f.add("tritond_broker_queue_depth", g, "Requests queued in the broker's schedulers", {}, snap.queued)
    f.add("tritond_broker_inflight_batches", g, "Batches executing in workers", {}, snap.inflight_batches)
    f.add("tritond_broker_round_trip_seconds", g, "Round trip of this scrape's request from the metrics frontend "
          "to the broker, in seconds", {}, round_trip_s)
    cache = snap.cache
    if cache is not None:
        f.add("tritond_cache_size_bytes", g, "Response cache size, in bytes", {}, cache.size)
        f.add("tritond_cache_used_bytes", g, "Response cache bytes held by entries", {}, cache.used)
        f.add("tritond_cache_entries", g, "Response cache entries", {}, cache.entries)
        f.add("tritond_cache_evictions", c, "Response cache entries evicted to make room", {}, cache.evictions)
    if snap.paging is not None:
        paging_families(f, snap.paging)


def paging_families(f: Families, p: R.PagingSnapshot) -> None:
    """--model-control-mode=paged: the budget, what is resident, and what paging cost per model."""
    g, c = "gauge", "counter"
    f.add("tritond_model_memory_budget_bytes", g, "Host memory the whole server may use "
          "(--model-memory-budget), in bytes", {}, p.budget)
    f.add("tritond_model_memory_used_bytes", g, "Host memory the server uses: its own processes, the pinned "
          "models and the resident, loading and exiting models' workers (PSS as last measured), in bytes",
          {}, p.used)
    f.add("tritond_server_memory_bytes", g, "Of the memory used, what the server's own processes (supervisor, "
          "broker, frontends, warm templates) and the pinned models' workers take (PSS), in bytes", {}, p.server)
    f.add("tritond_models_resident", g, "Pageable models resident now", {}, p.resident)
    for gpu, (budget, used) in sorted(p.gpus.items()):
        f.add("tritond_model_gpu_memory_budget_bytes", g, "Device memory the server may use on this GPU "
              "(--model-gpu-memory-budget), in bytes", {"gpu": str(gpu)}, budget)
        f.add("tritond_model_gpu_memory_used_bytes", g, "Device memory the server's processes hold on this GPU "
              "(NVML, as last measured), in bytes", {"gpu": str(gpu)}, used)
    f.summary("tritond_page_in_first_response_us", "Time from the request that paged a model in to its "
              "answer, in microseconds", {}, p.first_response)
    for m in p.models:
        labels = {"model": m.name}
        f.add("tritond_model_resident", g, "1 while the model is resident, 0 while it is paged out", labels,
              int(m.resident))
        f.add("tritond_model_page_ins", c, "Times the model was paged in", labels, m.page_ins)
        f.add("tritond_model_page_outs", c, "Times the model was paged out", labels, m.page_outs)
        f.add("tritond_model_page_in_first_response_count", c, "Page-ins whose first request was answered",
              labels, m.first_response_count)
        f.add("tritond_model_page_in_first_response_duration_us", c, "Time from the requests that paged the model "
              "in to their answers, summed, in microseconds", labels, m.first_response_ns // 1000)
        f.add("tritond_model_memory_bytes", g, "The model's workers' memory (PSS) when last measured resident, "
              "in bytes", labels, m.memory_bytes)
        for gpu, held in sorted(m.gpu_memory.items()):
            f.add("tritond_model_gpu_memory_bytes", g, "Device memory the model's workers held on this GPU when "
                  "last measured resident, in bytes", dict(labels, gpu=str(gpu)), held)


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class MetricsEndpoint:
    """GET /metrics of the first HTTP frontend process."""

    def __init__(self, client: Any, opts: ServerOptions) -> None:
        self.client = client
        self.cfg = opts.metrics
        self.server_id = opts.server_id
        self.sampler = HostSampler(opts.supervisor_pid or os.getppid(), opts.cpu_metrics, opts.gpu_metrics)
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.sampler.run(self.cfg.interval_ms / 1000.0))

    async def render(self) -> bytes:
        """One scrape: raises TritonError when the broker does not answer."""
        t0 = time.monotonic()
        snap = await self.client.control(ModelMetrics(), timeout=5)
        rtt = time.monotonic() - t0
        f = Families()
        for m in snap.models:
            model_families(f, m, self.cfg)
        server_families(f, snap, self.sampler, self.server_id, rtt)
        custom_families(f, snap.custom)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(list(f.by_name.values())))
        return exposition(registry.collect())

