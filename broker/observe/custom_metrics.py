"""The metric families Python models make (pb_utils.MetricFamily and its Metrics), served on the
metrics endpoint beside the server's own, as Triton's core keeps them for its python backend.

A family is found by its name (the first description stays; another kind is refused) and a
metric by its labels, so every instance of every model that names them shares them, and each
operation answers with the shared value. Each worker's Python objects hold references; a family
or metric goes when the last reference is dropped (its object deleted, its worker gone). A metric
whose family went refuses every operation, as Triton's does.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritond.wire import replies as R
from tritond.wire.errors import invalid
from tritond.wire.schema import MetricDrop, MetricFamilyNew, MetricNew, MetricOp

KINDS = ("counter", "gauge", "histogram")
FAMILY_GONE = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."


@dataclass(eq=False)
class _Metric:
    id: int
    family: "_Family"
    labels: dict[str, str]
    bounds: list[float] = field(default_factory=list)
    value: float = 0.0
    counts: list[int] = field(default_factory=list)      # a histogram's, per bucket (+Inf last)
    refs: Counter = field(default_factory=Counter)       # by owner (a worker's identity)


@dataclass(eq=False)
class _Family:
    id: int
    name: str
    description: str
    kind: str
    refs: Counter = field(default_factory=Counter)
    metrics: dict[tuple, _Metric] = field(default_factory=dict)
    gone: bool = False


class CustomMetrics:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.by_name: dict[str, _Family] = {}
        self.families: dict[int, _Family] = {}
        self.metrics: dict[int, _Metric] = {}

    def handle(self, owner: bytes, op: MetricFamilyNew | MetricNew | MetricOp | MetricDrop) -> R.ControlResult:
        """One model's metric operation; raises TritonError (INVALID_ARG) for one it may not do."""
        if isinstance(op, MetricFamilyNew):
            return self.family(owner, op)
        if isinstance(op, MetricNew):
            return self.metric(owner, op)
        if isinstance(op, MetricOp):
            return self.apply(op)
        self.drop(owner, op)
        return None

    def family(self, owner: bytes, op: MetricFamilyNew) -> R.MetricId:
        if not op.name:
            raise invalid("Metric family name cannot be empty")
        if not 0 <= op.kind < len(KINDS):
            raise invalid(f"Unknown metric family kind {op.kind}")
        fam = self.by_name.get(op.name)
        if fam is None:
            fam = _Family(next(self.ids), op.name, op.description, KINDS[op.kind])
            self.by_name[op.name] = self.families[fam.id] = fam
        elif fam.kind != KINDS[op.kind]:
            raise invalid(f"Metric family '{op.name}' already exists as a {fam.kind}, not a {KINDS[op.kind]}")
        fam.refs[owner] += 1
        return R.MetricId(fam.id)

    def metric(self, owner: bytes, op: MetricNew) -> R.MetricId:
        fam = self._family(op.family)
        bounds: list[float] = []
        if fam.kind == "histogram":
            if op.buckets is None:
                raise invalid("Must specify buckets for a histogram metric")
            if any(not math.isfinite(b) for b in op.buckets) or any(
                    b >= a for b, a in zip(op.buckets, op.buckets[1:])):
                raise invalid(f"Histogram buckets must be finite and strictly increasing, got {op.buckets}")
            bounds = list(op.buckets)
        key = tuple(sorted(op.labels.items()))
        m = fam.metrics.get(key)
        if m is None:
            m = _Metric(next(self.ids), fam, dict(op.labels), bounds, counts=[0] * (len(bounds) + 1))
            fam.metrics[key] = self.metrics[m.id] = m
        m.refs[owner] += 1
        return R.MetricId(m.id)

    def apply(self, op: MetricOp) -> R.MetricValue:
        m = self.metrics.get(op.metric)
        if m is None:
            raise invalid("Invalid metric operation: the metric has been deleted")
        if m.family.gone:
            raise invalid(FAMILY_GONE)
        kind = m.family.kind
        if op.op == "observe":
            if kind != "histogram":
                raise invalid(f"observe() is not supported by a {kind} metric")
            m.counts[bisect.bisect_left(m.bounds, op.value)] += 1
            m.value += op.value
            return R.MetricValue(m.value)
        if kind == "histogram":
            raise invalid(f"{op.op}() is not supported by a histogram metric")
        if op.op == "increment":
            if kind == "counter" and op.value < 0:
                raise invalid("A counter cannot be incremented by a negative value")
            m.value += op.value
        elif op.op == "set":
            if kind == "counter":
                raise invalid("set() is not supported by a counter metric")
            m.value = op.value
        elif op.op != "value":
            raise invalid(f"unknown metric operation '{op.op}'")
        return R.MetricValue(m.value)

    def drop(self, owner: bytes, op: MetricDrop) -> None:
        self._unref(self.metrics.get(op.metric), owner, 1, self._forget_metric)
        self._unref(self.families.get(op.family), owner, 1, self._forget_family)

    def owner_gone(self, owner: bytes) -> None:
        """A worker ended: the references its objects held are gone with it."""
        for m in [m for m in self.metrics.values() if owner in m.refs]:
            self._unref(m, owner, m.refs[owner], self._forget_metric)
        for fam in [f for f in self.families.values() if owner in f.refs]:
            self._unref(fam, owner, fam.refs[owner], self._forget_family)

    @staticmethod
    def _unref(held: _Metric | _Family | None, owner: bytes, n: int, forget: Callable[[Any], None]) -> None:
        if held is not None and held.refs[owner] > 0:
            held.refs[owner] -= n
            if not +held.refs:
                forget(held)

    def snapshot(self) -> list[R.CustomFamily]:
        out = []
        for fam in self.by_name.values():
            metrics = [R.CustomMetric(m.labels, m.value, R.HistogramSnapshot(m.bounds, m.counts, m.value)
                                      if fam.kind == "histogram" else None) for m in fam.metrics.values()]
            out.append(R.CustomFamily(fam.name, fam.description, fam.kind, metrics))
        return out

    def _family(self, fid: int) -> _Family:
        fam = self.families.get(fid)
        if fam is None or fam.gone:
            raise invalid(FAMILY_GONE)
        return fam

    def _forget_metric(self, m: _Metric) -> None:
        self.metrics.pop(m.id, None)
        m.family.metrics.pop(tuple(sorted(m.labels.items())), None)
        if m.family.gone and not m.family.metrics:
            self.families.pop(m.family.id, None)

    def _forget_family(self, fam: _Family) -> None:
        """Its series leave the endpoint; its metrics' objects may live on, and refuse to work."""
        fam.gone = True
        if self.by_name.get(fam.name) is fam:
            del self.by_name[fam.name]
        if not fam.metrics:
            self.families.pop(fam.id, None)


METRIC_OPS = (MetricFamilyNew, MetricNew, MetricOp, MetricDrop)
