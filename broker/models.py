"""What is loaded: one record per model version, with its instances, scheduler and stats.

Discovery (what is on disk) lives in tritond.repository; this table says what the broker
made of it and is what every frontend is told (protocol.Table).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tritond.repository.parameters import config_parameter

from .pool import Instance
from .scheduler import Scheduler
from .stats import ModelStats

READY = "READY"
LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"

DEFAULT_EXEC_TIMEOUT_S = 60.0


@dataclass
class ModelVersion:
    name: str
    version: int
    model_dir: str
    repo: str
    config: dict[str, Any] | None
    state: str = LOADING
    reason: str = ""
    instances: list[Instance] = field(default_factory=list)
    scheduler: Scheduler | None = None
    stats: ModelStats | None = None
    wake_ns: int = 0                 # when the batcher wants another look (0: not waiting)
    dispatch_seq: int = 0            # preserve_ordering: next sequence number to hand out
    send_seq: int = 0                # preserve_ordering: next sequence number to answer
    held: dict[int, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stats = ModelStats(self.name, self.version)

    @property
    def max_batch_size(self) -> int:
        return int((self.config or {}).get("max_batch_size", 0) or 0)

    @property
    def exec_timeout_s(self) -> float:
        raw = config_parameter(self.config or {}, "execution_timeout_seconds")
        try:
            return float(raw) if raw else DEFAULT_EXEC_TIMEOUT_S
        except ValueError:
            return DEFAULT_EXEC_TIMEOUT_S

    @property
    def idempotent(self) -> bool:
        return config_parameter(self.config or {}, "idempotent").lower() in ("1", "true", "yes")

    def serving(self) -> list[Instance]:
        return [i for i in self.instances if i.state in ("READY", "BUSY")]

    def free_instances(self) -> list[Instance]:
        return [i for i in self.instances if i.state == "READY"]
