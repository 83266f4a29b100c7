"""What `tritond analyze` optimizes: maximise throughput (optionally with a latency limit), or
minimise latency (optionally with a throughput floor); either with a memory budget."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Point(Protocol):
    """A measured operating point: one configuration at one concurrency."""

    infer_per_sec: float
    latency_ms: float          # at the objective's percentile
    memory_mb: float | None


@dataclass(frozen=True)
class Objective:
    maximize: str = "throughput"          # "throughput" | "latency" (minimised)
    percentile: int = 99
    max_latency_ms: float | None = None
    min_throughput: float | None = None
    memory_budget_mb: float | None = None

    def violations(self, p: Point) -> list[str]:
        """The constraints a point breaks, in words (empty: feasible)."""
        out = []
        if self.max_latency_ms is not None and p.latency_ms > self.max_latency_ms:
            out.append(f"p{self.percentile} {p.latency_ms:.2f} ms > {self.max_latency_ms:g} ms")
        if self.min_throughput is not None and p.infer_per_sec < self.min_throughput:
            out.append(f"{p.infer_per_sec:,.1f} infer/s < {self.min_throughput:g} infer/s")
        if self.memory_budget_mb is not None and p.memory_mb is not None and p.memory_mb > self.memory_budget_mb:
            out.append(f"memory {p.memory_mb:,.0f} MB > {self.memory_budget_mb:g} MB")
        return out

    def feasible(self, p: Point) -> bool:
        return not self.violations(p)

    def value(self, p: Point) -> float:
        """Higher is better."""
        return p.infer_per_sec if self.maximize == "throughput" else -p.latency_ms

    def key(self, p: Point) -> tuple:
        """Sort key, best last: feasible points beat infeasible ones; among infeasible points
        the one nearest the latency limit (then the objective) ranks higher."""
        feasible = self.feasible(p)
        return (feasible, self.value(p) if feasible else -p.latency_ms, self.value(p))

    def best(self, points: Sequence[Point]) -> Point | None:
        return max(points, key=self.key) if points else None

    def better(self, a: Point | None, b: Point | None, margin: float = 0.0) -> bool:
        """Whether a beats b, by more than `margin` (a fraction) when both are feasible."""
        if a is None:
            return False
        if b is None:
            return True
        fa, fb = self.feasible(a), self.feasible(b)
        if fa != fb:
            return fa
        if not fa:
            return a.latency_ms < b.latency_ms * (1 - margin)
        va, vb = self.value(a), self.value(b)
        return va > vb + abs(vb) * margin

    def gain(self, winner: Point, base: Point) -> float:
        """How many times better `winner` is on the objective (throughput, or inverse latency)."""
        if self.maximize == "throughput":
            return winner.infer_per_sec / base.infer_per_sec
        return base.latency_ms / winner.latency_ms

    def describe(self) -> str:
        goal = "highest throughput" if self.maximize == "throughput" else f"lowest p{self.percentile} latency"
        limits = []
        if self.max_latency_ms is not None:
            limits.append(f"p{self.percentile} latency ≤ {self.max_latency_ms:g} ms")
        if self.min_throughput is not None:
            limits.append(f"throughput ≥ {self.min_throughput:g} infer/s")
        if self.memory_budget_mb is not None:
            limits.append(f"memory ≤ {self.memory_budget_mb:g} MB")
        return goal + (" with " + " and ".join(limits) if limits else "")


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """Points no other point beats on both throughput (higher) and latency (lower), by throughput."""
    front = []
    for p in sorted(points, key=lambda p: (p.latency_ms, -p.infer_per_sec)):
        if not front or p.infer_per_sec > front[-1].infer_per_sec:
            front.append(p)
    return front
