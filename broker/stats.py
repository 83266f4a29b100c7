"""Per-model-version statistics in Triton's shape (GET /v2/models/{m}/stats, ModelStatistics)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


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

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One model execution of `batch_size` elements (Triton counts elements, not requests)."""
        self.execution_count += 1
        self.inference_count += batch_size
        b = self.batches.setdefault(batch_size, BatchStat())
        b.compute_input.add(input_ns)
        b.compute_infer.add(infer_ns)
        b.compute_output.add(output_ns)
        self.last_inference_ms = int(time.time() * 1000)

    def record_request(self, ok: bool, total_ns: int, queue_ns: int | None,
                       input_ns: int = 0, infer_ns: int = 0, output_ns: int = 0) -> None:
        """One request finished; compute times are the batch's, attributed to each request."""
        if not ok:
            self.fail.add(total_ns)
            return
        self.success.add(total_ns)
        if queue_ns is not None:
            self.queue.add(queue_ns)
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": bs,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for bs, b in sorted(self.batches.items())
            ],
            "memory_usage": [],
            "restart_count": self.restarts,
        }
