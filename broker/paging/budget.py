"""The memory budget's arithmetic: how much a model will take, and which resident models to page
out, least recently used first, so that it fits. Pure: the pager (pager.py) gives it numbers and
acts on its answer, so the policy is tested without processes."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

HOST = "host"


@dataclass(frozen=True)
class Candidate:
    """A resident model that could be paged out now: unpinned, nothing queued or executing."""
    name: str
    size: int           # bytes of host memory its workers use (measured)
    last_used: float    # when it last executed or was paged in (larger: more recent)
    devices: dict[int, int] = field(default_factory=dict)      # bytes its workers hold on each GPU


class Sizes:
    """What each model's workers used when last measured. A model never measured yet is
    expected to take what the measured ones take on average (nothing measured: 0, the first
    model is let in and measured)."""

    def __init__(self) -> None:
        self.known: dict[str, int] = {}

    def record(self, name: str, size: int) -> None:
        self.known[name] = size

    def estimate(self, name: str) -> int:
        size = self.known.get(name)
        if size is not None:
            return size
        if not self.known:
            return 0
        return sum(self.known.values()) // len(self.known)


def victims(budget: int, used: int, need: int, candidates: Iterable[Candidate],
            devices: dict[int, tuple[int, int, int]] | None = None) -> list[str] | None:
    """The models to page out, least recently used first, so that `need` more bytes fit in
    `budget` with `used` in use, and on each GPU of `devices` (id -> budget, used, need) its
    need too: [] when all fit already, None when they do not fit even with every candidate
    paged out. A candidate that frees nothing where room is short stays."""
    over: dict[object, int] = {HOST: used + need - budget}
    for gpu, (gpu_budget, gpu_used, gpu_need) in (devices or {}).items():
        over[gpu] = gpu_used + gpu_need - gpu_budget
    if all(v <= 0 for v in over.values()):
        return []
    out: list[str] = []
    for c in sorted(candidates, key=lambda c: (c.last_used, c.name)):
        frees = {HOST: c.size, **c.devices}
        if not any(v > 0 and frees.get(r, 0) > 0 for r, v in over.items()):
            continue
        out.append(c.name)
        for r in over:
            over[r] -= frees.get(r, 0)
        if all(v <= 0 for v in over.values()):
            return out
    return None


def backoff_s(failures: int, first_s: float = 5.0, most_s: float = 300.0) -> float:
    """How long a model whose load failed `failures` times in a row waits before it is tried again."""
    return min(most_s, first_s * 2 ** max(0, failures - 1))


class Devices:
    """The GPU budgets (--model-gpu-memory-budget): on each GPU, what each pageable model's
    workers hold there (measured; one not measured yet is expected to hold what the measured
    ones do on average) and what the rest of the server holds (its own processes, the pinned
    models)."""

    def __init__(self, budgets: dict[int, int]) -> None:
        self.budgets = budgets
        self.sizes = {gpu: Sizes() for gpu in budgets}
        self.base = {gpu: 0 for gpu in budgets}

    def need(self, name: str, gpus: Iterable[int]) -> dict[int, int]:
        return {gpu: self.sizes[gpu].estimate(name) for gpu in gpus}

    def record(self, name: str, gpus: Iterable[int], held: dict[int, int]) -> None:
        for gpu in gpus:
            self.sizes[gpu].record(name, held.get(gpu, 0))

    def used(self, gpu: int, resident: dict[str, frozenset[int]]) -> int:
        """Bytes held on `gpu` by the rest of the server and the `resident` models (name -> GPUs)."""
        est = self.sizes[gpu].estimate
        return self.base[gpu] + sum(est(name) for name, gpus in resident.items() if gpu in gpus)

    def too_big(self, name: str, gpus: Iterable[int]) -> int | None:
        """The first GPU on which the model was measured bigger than its budget leaves beside the
        rest of the server; None when it fits on every one."""
        for gpu in gpus:
            if self.sizes[gpu].known.get(name, 0) > self.budgets[gpu] - self.base[gpu]:
                return gpu
        return None
