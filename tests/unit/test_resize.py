"""Which instances a load that changes only the instance groups keeps, starts and stops."""
from __future__ import annotations

from tritond.broker.lifecycle.reload import LoadedFrom
from tritond.broker.lifecycle.resize import match, only_instances_changed
from tritond.broker.lifecycle.version_state import instances_of
from tritond.broker.scheduling.queued import QueuedScheduling
from tritond.broker.tables.model_version import READY, ModelVersion
from tritond.repository.fingerprint import Fingerprint


def cfg(*groups: dict, batch: int = 0) -> dict:
    return {"name": "m", "backend": "python", "max_batch_size": batch, "instance_group": list(groups)}


def version(config: dict) -> ModelVersion:
    mv = ModelVersion("m", 1, "/r/m", "/r", config)
    mv.instances = instances_of("m", 1, config)
    mv.state = READY
    mv.scheduler = QueuedScheduling.__new__(QueuedScheduling)      # resized() does nothing for it
    return mv


def test_instances_with_unchanged_settings_stay_whatever_their_names_and_groups():
    mv = version(cfg({"name": "a", "count": 2, "kind": "KIND_CPU"}))
    kept = list(mv.instances)
    added, removed = match(mv, cfg({"name": "x", "count": 1, "kind": "KIND_CPU"},
                                   {"name": "y", "count": 2, "kind": "KIND_CPU"}))
    assert [i.index for i in added] == [2] and removed == []
    assert mv.instances[:2] == kept and [i.group for i in kept] == [0, 1]
    added, removed = match(mv, cfg({"count": 1, "kind": "KIND_CPU"}))
    assert added == [] and len(removed) == 2 and all(i.leaving for i in removed)
    assert [i for i in mv.instances if not i.leaving] == [kept[0]]


def test_other_settings_make_other_instances_and_names_never_repeat():
    mv = version(cfg({"count": 1, "kind": "KIND_CPU"}))
    limited = {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 2}}
    added, removed = match(mv, cfg(limited))
    assert len(added) == 1 and len(removed) == 1
    assert added[0].name != removed[0].name and added[0].index == 1


def test_only_instance_groups_changed_needs_the_same_files_and_fields():
    fp = Fingerprint("s", {1: "v"}, "/r/m", "c")
    old = {1: version(cfg({"count": 1, "kind": "KIND_CPU"}))}
    before = LoadedFrom("/r/m", cfg({"count": 1, "kind": "KIND_CPU"}), fp)
    now = LoadedFrom("/r/m", cfg({"count": 3, "kind": "KIND_CPU"}), Fingerprint("s", {1: "v"}, "/r/m", "c2"))
    assert only_instances_changed(before, now, old, [1])
    assert not only_instances_changed(before, LoadedFrom("/r/m", cfg({"count": 3}, batch=4), fp), old, [1])
    assert not only_instances_changed(before, LoadedFrom("/r/m", now.config, Fingerprint("s", {1: "v2"})), old, [1])
    assert not only_instances_changed(before, now, old, [1, 2])
    assert not only_instances_changed(None, now, old, [1])
