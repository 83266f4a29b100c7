"""How the first of several brokers merges the others' answers to a control operation."""
from __future__ import annotations

import pytest

from tritond.broker.shards.fanout import _Gather, _index, _stats, Fanout
from tritond.wire import replies as R
from tritond.wire.errors import TritonError, unavailable


def test_gather_answers_once_every_broker_did():
    seen = []
    gather = _Gather(3, seen.append)
    gather.answer_for(2)("c")
    gather.answer_for(0)("a")
    assert seen == []
    gather.answer_for(1)(error=unavailable("away"))
    [results] = seen
    assert results[0] == "a" and results[2] == "c" and isinstance(results[1], TritonError)


def test_index_merges_by_name_and_leaves_out_a_broker_away():
    first = R.IndexReply([R.ModelIndex("b", "1", "READY"), R.ModelIndex("d")])
    second = R.IndexReply([R.ModelIndex("a", "1", "READY"), R.ModelIndex("c", "2", "UNAVAILABLE", "bad")])
    merged = _index([first, second, unavailable("restarting")])
    assert [m.name for m in merged.models] == ["a", "b", "c", "d"]


def test_an_error_of_the_first_broker_is_the_answer():
    with pytest.raises(TritonError, match="no"):
        _stats([TritonError(3, "no"), R.StatsReply([])])


def test_a_drain_ends_drained_only_where_every_broker_drained():
    assert Fanout._drained([R.DrainReply(True), R.DrainReply(True)]).drained
    assert not Fanout._drained([R.DrainReply(True), R.DrainReply(False)]).drained
    assert not Fanout._drained([R.DrainReply(True), unavailable("gone")]).drained
