"""The first-response histogram counts whole milliseconds, as Triton observes it: its sum is an
integer clients parse as one (Triton's L0_metrics does)."""
from __future__ import annotations

from tritond.broker.observe.metrics import Latencies


def test_answers_and_cache_hits_are_observed_in_whole_milliseconds():
    lat = Latencies(summaries=False, histogram=True)
    lat.success(2_600_000, 0, 0, 0, 0)
    lat.cache_hit(1_999_999, 0, 0)
    lat.first_response_ms(7)
    snap = lat.first_response.snapshot()
    assert snap.sum == 2 + 1 + 7 and sum(snap.counts) == 3
    assert float(snap.sum).is_integer()
