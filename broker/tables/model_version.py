"""What is loaded: one record per model version, with its instances, scheduler and stats.

Discovery (what is on disk) lives in tritond.repository; a `ModelVersion` says what the broker
made of it. Its config is parsed once into a `ModelView`, which travels with the model table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritond.repository.threads import ThreadChoice
from tritond.repository.view import model_view
from tritond.wire.schema import ModelState, ModelView

from tritond.broker.supervision.pool import Instance, InstanceState
from tritond.broker.observe.stats import ModelStats

LOADING = ModelState.LOADING
READY = ModelState.READY
UNAVAILABLE = ModelState.UNAVAILABLE
UNLOADING = ModelState.UNLOADING


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    model_dir: str
    repo: str
    config: dict[str, Any] | None
    state: ModelState = LOADING
    reason: str = ""
    unloaded: bool = False           # UNAVAILABLE because it was unloaded (not a failure)
    restarting: bool = False         # UNAVAILABLE while its instances restart: requests queue
    restarting_since: float = 0.0
    view: ModelView = field(default_factory=ModelView)
    instances: list[Instance] = field(default_factory=list)
    scheduler: Any = None            # its Scheduling (scheduling/policy.py), set once READY
    stats: ModelStats = field(init=False)
    wake_ns: int = 0                 # when the batcher wants another look (0: not waiting)
    dispatch_seq: int = 0            # preserve_ordering: next sequence number to hand out
    send_seq: int = 0                # preserve_ordering: next sequence number to answer
    held: dict[int, list] = field(default_factory=dict)
    load_started: float = 0.0        # clock time its load began
    load_duration: float = 0.0       # seconds from then until it was READY
    reload_error: str = ""           # why a reload of this version failed while it kept serving
    retiring: bool = False           # left service: drains, then its workers stop (retire.py)
    retire_started: float = 0.0
    latency: "Callable[[Any], Any] | None" = field(default=None, repr=False)   # --metrics-config observers
    # Each instance's thread budget (by index), decided when the version loads (lifecycle/threads.py)
    threads: dict[int, ThreadChoice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stats = ModelStats(self.name, self.version, latency=self.latency(self.config) if self.latency else None)
        if self.config is not None:
            self.view = model_view(self.config, self.model_dir)

    def set_config(self, config: dict[str, Any]) -> None:
        self.config = config
        self.view = model_view(config, self.model_dir)

    @property
    def max_batch_size(self) -> int:
        return self.view.max_batch_size

    def serving(self) -> list[Instance]:
        return [i for i in self.instances if i.serving]

    def free_instances(self) -> list[Instance]:
        return [i for i in self.instances if i.state is InstanceState.READY and not i.leaving]
