"""The broker's registry of the metric families Python models make: found by name and labels,
the first description kept, another kind refused, references counted per worker."""
import pytest

from tritond.broker.observe.custom_metrics import FAMILY_GONE, CustomMetrics
from tritond.wire.errors import TritonError
from tritond.wire.schema import MetricDrop, MetricFamilyNew, MetricNew, MetricOp

A, B = b"worker-a", b"worker-b"


def value(reg: CustomMetrics, metric: int, op: str = "value", x: float = 0.0) -> float:
    return reg.handle(A, MetricOp(metric, op, x)).value


def test_families_and_metrics_are_found_by_name_and_labels():
    reg = CustomMetrics()
    f1 = reg.handle(A, MetricFamilyNew("hits", "first", 0)).id
    assert reg.handle(B, MetricFamilyNew("hits", "second", 0)).id == f1
    with pytest.raises(TritonError, match="already exists as a counter"):
        reg.handle(A, MetricFamilyNew("hits", "first", 1))
    m1 = reg.handle(A, MetricNew(f1, {"a": "1", "b": "2"})).id
    assert reg.handle(B, MetricNew(f1, {"b": "2", "a": "1"})).id == m1
    value(reg, m1, "increment", 2)
    assert value(reg, m1) == 2
    (fam,) = reg.snapshot()
    assert (fam.name, fam.description, fam.kind, fam.metrics[0].value) == ("hits", "first", "counter", 2)


def test_each_kind_refuses_what_it_does_not_do():
    reg = CustomMetrics()
    counter = reg.handle(A, MetricNew(reg.handle(A, MetricFamilyNew("c", "", 0)).id)).id
    gauge = reg.handle(A, MetricNew(reg.handle(A, MetricFamilyNew("g", "", 1)).id)).id
    hist_family = reg.handle(A, MetricFamilyNew("h", "", 2)).id
    for bad in (None, [2.0, 1.0], [1.0, 1.0]):
        with pytest.raises(TritonError):
            reg.handle(A, MetricNew(hist_family, {}, bad))
    hist = reg.handle(A, MetricNew(hist_family, {}, [1.0, 5.0])).id
    for metric, op, x in ((counter, "increment", -1), (counter, "set", 1), (gauge, "observe", 1), (hist, "value", 0),
                          (hist, "set", 1)):
        with pytest.raises(TritonError):
            value(reg, metric, op, x)
    assert value(reg, gauge, "increment", -2.5) == -2.5 and value(reg, gauge, "set", 4) == 4
    for x in (0.5, 3, 9):
        value(reg, hist, "observe", x)
    h = next(f for f in reg.snapshot() if f.name == "h").metrics[0].histogram
    assert (h.bounds, h.counts, h.sum) == ([1.0, 5.0], [1, 1, 1], 12.5)


def test_a_family_goes_with_its_last_reference_and_its_metrics_then_refuse():
    reg = CustomMetrics()
    fam = reg.handle(A, MetricFamilyNew("f", "", 1)).id
    assert reg.handle(B, MetricFamilyNew("f", "", 1)).id == fam
    metric = reg.handle(A, MetricNew(fam, {"k": "v"})).id
    reg.handle(A, MetricDrop(family=fam))
    assert [f.name for f in reg.snapshot()] == ["f"], "worker B still holds it"
    reg.owner_gone(B)
    assert reg.snapshot() == []
    with pytest.raises(TritonError, match=FAMILY_GONE.replace("(", r"\(").replace(")", r"\)")):
        value(reg, metric, "set", 1)
    reg.handle(A, MetricDrop(metric=metric))
    assert not reg.metrics and not reg.families
