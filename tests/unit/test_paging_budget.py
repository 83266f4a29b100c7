"""The paging budget's arithmetic (broker/paging/budget.py): least recently used first, only what
is needed, None when nothing makes room; sizes expected from what was measured."""
from __future__ import annotations

from tritond.broker.paging.budget import Candidate, Devices, Sizes, backoff_s, victims
from tritond.broker.paging.memory import models_pss, pss_bytes


def test_fits_already_pages_nothing_out():
    assert victims(100, 60, 40, [Candidate("a", 30, 1.0)]) == []


def test_least_recently_used_go_first_and_only_as_many_as_needed():
    cands = [Candidate("new", 30, 9.0), Candidate("old", 30, 1.0), Candidate("mid", 30, 5.0)]
    assert victims(100, 90, 50, cands) == ["old", "mid"]
    assert victims(100, 90, 40, cands) == ["old"]


def test_ties_in_recency_are_broken_by_name():
    assert victims(10, 10, 5, [Candidate("b", 5, 1.0), Candidate("a", 5, 1.0)]) == ["a"]


def test_no_room_even_with_every_candidate_out():
    assert victims(100, 95, 40, [Candidate("a", 10, 1.0)]) is None
    assert victims(100, 95, 40, []) is None


def test_a_model_never_measured_is_expected_to_take_the_average():
    sizes = Sizes()
    assert sizes.estimate("x") == 0          # nothing measured yet
    sizes.record("a", 10)
    sizes.record("b", 30)
    assert sizes.estimate("x") == 20
    assert sizes.estimate("a") == 10
    sizes.record("a", 50)                    # measured again: the latest counts
    assert sizes.estimate("a") == 50


def test_backoff_doubles_and_is_bounded():
    assert [backoff_s(n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    assert backoff_s(30) == 300.0


def test_pss_of_this_process_and_of_a_missing_one():
    import os
    assert pss_bytes(os.getpid()) > 0
    assert pss_bytes(2 ** 22 + 12345) is None
    both = models_pss({"me": [os.getpid()], "gone": [os.getpid(), 2 ** 22 + 12345]})
    assert set(both) == {"me"}


def test_a_gpu_short_of_room_pages_out_only_models_holding_memory_there():
    cands = [Candidate("cpu_old", 30, 1.0), Candidate("gpu_mid", 30, 5.0, {0: 100}),
             Candidate("gpu_new", 30, 9.0, {0: 100})]
    assert victims(1000, 100, 30, cands, {0: (200, 150, 100)}) == ["gpu_mid"]     # the host has room
    assert victims(1000, 100, 30, cands, {0: (200, 200, 200)}) == ["gpu_mid", "gpu_new"]
    assert victims(1000, 100, 30, cands, {0: (200, 200, 300)}) is None
    assert victims(100, 90, 40, cands, {0: (200, 0, 50)}) == ["cpu_old"]          # only the host is short


def test_a_model_measured_bigger_than_a_gpus_budget_leaves():
    devices = Devices({0: 1000, 1: 500})
    devices.base = {0: 100, 1: 100}
    devices.record("m", [0, 1], {0: 800, 1: 450})
    assert devices.too_big("m", [0, 1]) == 1
    assert devices.need("m", [0]) == {0: 800}
    assert devices.need("unmeasured", [0]) == {0: 800}        # what the measured ones hold on average
    assert devices.used(0, {"m": frozenset({0, 1}), "cpu": frozenset()}) == 900
