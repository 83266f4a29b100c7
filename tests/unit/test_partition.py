"""Which broker schedules which model (--broker-shards): ensembles stay with what they compose,
a model alone lands where its name hashes, and every process computes the same split."""
from __future__ import annotations

import subprocess
import sys

from tritond.repository.partition import partition, shard_of


def test_one_broker_takes_everything():
    assert partition({"a": [], "e": ["a", "b"]}, 1) == {"a": 0, "e": 0, "b": 0}


def test_a_model_alone_lands_where_its_name_hashes():
    names = [f"model_{i}" for i in range(64)]
    split = partition({n: [] for n in names}, 4)
    assert split == {n: shard_of(n, 4) for n in names}
    assert set(split.values()) == {0, 1, 2, 3}


def test_ensembles_sharing_a_model_form_one_group():
    steps = {"pre": [], "net": [], "post": [], "other": [], "e1": ["pre", "net"], "e2": ["net", "post"],
             "nested": ["e2", "late"]}
    for shards in (2, 3, 5, 8):
        split = partition(steps, shards)
        group = {"pre", "net", "post", "e1", "e2", "nested", "late"}
        assert {split[n] for n in group} == {shard_of("e1", shards)}      # its first name in sort order
        assert split["other"] == shard_of("other", shards)


def test_the_split_does_not_depend_on_the_process():
    code = ("from tritond.repository.partition import partition;"
            "print(sorted(partition({f'm{i}': [] for i in range(32)} | {'e': ['m3', 'm9']}, 3).items()))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(runs) == 1
