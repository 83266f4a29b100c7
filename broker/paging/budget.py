"""The memory budget's arithmetic: how much a model will take, and which resident models to page
out, least recently used first, so that it fits. Pure: the pager (pager.py) gives it numbers and
acts on its answer, so the policy is tested without processes."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """A resident model that could be paged out now: unpinned, nothing queued or executing."""
    name: str
    size: int           # bytes its workers use (measured)
    last_used: float    # when it last executed or was paged in (larger: more recent)


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


def victims(budget: int, used: int, need: int, candidates: Iterable[Candidate]) -> list[str] | None:
    """The models to page out, least recently used first, so that `need` more bytes fit in
    `budget` with `used` in use: [] when they fit already, None when they do not fit even with
    every candidate paged out."""
    if used + need <= budget:
        return []
    out: list[str] = []
    for c in sorted(candidates, key=lambda c: (c.last_used, c.name)):
        out.append(c.name)
        used -= c.size
        if used + need <= budget:
            return out
    return None


def backoff_s(failures: int, first_s: float = 5.0, most_s: float = 300.0) -> float:
    """How long a model whose load failed `failures` times in a row waits before it is tried again."""
    return min(most_s, first_s * 2 ** max(0, failures - 1))
