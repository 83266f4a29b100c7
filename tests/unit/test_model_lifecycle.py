"""Loading, reloading and unloading in the real broker, in-process with a fake clock: a reload
stages new workers while the old ones serve and switches atomically; a failed reload keeps
the old version; unload drains, bounded by its timeout; operations on a model run one at a
time and no worker is ever left outside the broker's table; the rate limiter grants shared
resources to one instance at a time."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.broker.lifecycle.runner import MAX_WAITING
from tritond.broker.supervision.pool import InstanceState
from tritond.wire import replies as R
from tritond.wire import schema as S
from tritond.wire.errors import Code

X = np.ones(2, np.float32)
cids = itertools.count(1000)


def send(h: Harness, op) -> int:
    cid = next(cids)
    h.from_frontend(S.Control(cid, op))
    return cid


def reply(h: Harness, cid: int) -> S.ControlReply | None:
    for _, m in h.to_frontends(S.ControlReply):
        if m.cid == cid:
            return m
    return None


def table(h: Harness, name: str = "m") -> dict[int, S.ModelEntry]:
    return {e.version: e for e in h.broker.registry.table(False, 0).models if e.name == name}


def live(h: Harness, model: str | None = None) -> list:
    return [i for i in h.pool.live.values() if h.pool.alive(i) and (model is None or i.model == model)]


def no_orphans(h: Harness) -> None:
    """Every live worker is in the broker's instance table (so it is watched and will be reaped)."""
    spawned = {i.pid for i in h.broker.instances.spawned()}
    assert {i.pid for i in live(h)} <= spawned


def finish(h: Harness, model: str) -> None:
    for inst, ex in h.executing(model):
        h.answer(inst, ex, *[{"Y": S.Inline(X.tobytes())} for _ in ex.requests])


def stopped(h: Harness) -> list[str]:
    by_ident = {i.identity: i for mv in h.broker.registry.all_versions() for i in mv.instances}
    return [by_ident[ident].name for ident, _ in h.to_workers(S.Stop) if ident in by_ident]


def exit_stopped(h: Harness) -> None:
    """Workers that were told to stop exit."""
    for mv in list(h.broker.registry.all_versions()):
        for inst in mv.instances:
            if inst.state is InstanceState.STOPPING and h.pool.alive(inst):
                h.die(inst, 0)


@pytest.fixture
def repo(tmp_path):
    python_model(tmp_path, "m", ["X"], ["Y"])
    return tmp_path


def explicit(repo, **opts) -> Harness:
    return Harness(repo, model_control_mode="explicit", load_models=["m"], **opts).load("*")


def edit_config(repo, text: str) -> None:
    path = repo / "m" / "config.pbtxt"
    path.write_text(path.read_text() + " " + text)


def test_a_reload_serves_from_the_old_workers_until_the_new_ones_are_up(repo):
    h = explicit(repo)
    (old,) = h.instances("m")
    executing = h.infer("m", X=X)
    queued = h.infer("m", X=X)
    edit_config(repo, 'parameters { key: "tag" value: { string_value: "2" } }')
    cid = send(h, S.LoadModel("m"))
    assert reply(h, cid) is None                        # answered once the new version settled
    (new,) = [i for i in h.instances() if i.state is InstanceState.STARTING]
    assert table(h)[1].state is S.ModelState.READY     # the old version still serves
    during = h.infer("m", X=X)
    h.up("m")
    assert reply(h, cid).error is None
    mv = h.broker.registry.get("m")[1]
    assert mv.instances == [new] and mv.config["parameters"]["tag"]["string_value"] == "2"
    assert stopped(h) == []                             # the old worker still has work
    finish(h, "m")                                      # the executing batch, then the queued ones
    assert h.replies()[executing].error is None
    finish(h, "m")
    finish(h, "m")
    assert h.replies()[queued].error is None and h.replies()[during].error is None
    after = h.infer("m", X=X)
    ((inst, _),) = h.executing("m")
    assert inst is new                                  # new requests go to the new version
    h.tick()
    assert stopped(h) == [old.name] and old.state is InstanceState.STOPPING
    h.die(old, 0)
    h.tick()
    assert old not in [i for mv in h.broker.registry.all_versions() for i in mv.instances]
    assert after not in h.replies()
    no_orphans(h)


def test_a_failed_reload_keeps_the_old_version_serving(repo):
    h = explicit(repo)
    (old,) = h.instances("m")
    edit_config(repo, 'parameters { key: "tag" value: { string_value: "2" } }')
    cid = send(h, S.LoadModel("m"))
    (new,) = [i for i in h.instances() if i.state is InstanceState.STARTING]
    h.from_worker(new, S.WorkerDown("RuntimeError: weights corrupt"))
    err = reply(h, cid).error
    assert err.code is Code.INVALID_ARG
    assert err.message == ("load failed for model 'm': version 1 is at UNAVAILABLE state: "
                           "load failed for model 'm': RuntimeError: weights corrupt;\n")
    assert table(h)[1].state is S.ModelState.READY and h.broker.registry.get("m")[1].instances == [old]
    index = reply(h, send(h, S.RepositoryIndex())).result
    assert index == R.IndexReply([R.ModelIndex("m", "1", "READY", "a reload failed, this version still serves: "
                                                                  "load failed for model 'm': RuntimeError: "
                                                                  "weights corrupt")])
    rid = h.infer("m", X=X)
    finish(h, "m")
    assert h.replies()[rid].error is None
    h.die(new, 1)
    no_orphans(h)


def test_a_broken_config_keeps_the_old_version_serving(repo):
    h = explicit(repo)
    (repo / "m" / "config.pbtxt").write_text("max_batch_size: oops")
    err = reply(h, send(h, S.LoadModel("m"))).error
    assert err.code is Code.INVALID_ARG and err.message.startswith("load failed for model 'm': ")
    assert table(h)[1].state is S.ModelState.READY and h.pool.killed == []


def test_a_load_without_changes_does_not_reload(repo):
    h = explicit(repo)
    spawned = len(h.pool.specs)
    assert reply(h, send(h, S.LoadModel("m"))).error is None
    assert len(h.pool.specs) == spawned


def test_version_policy_changes_add_and_drop_exactly_those_versions(repo):
    for v in (2, 3):
        (repo / "m" / str(v)).mkdir()
        (repo / "m" / str(v) / "model.py").write_text("")
    h = explicit(repo)
    assert sorted(table(h)) == [3]
    (v3,) = h.instances("m")
    edit_config(repo, "version_policy { latest { num_versions: 2 } }")
    cid = send(h, S.LoadModel("m"))
    # The config changed, so every selected version reloads behind the serving one.
    assert sorted(i.version for i in h.instances(state=InstanceState.STARTING)) == [2, 3]
    h.up("m")
    assert reply(h, cid).error is None and sorted(table(h)) == [2, 3]
    h.tick()
    assert stopped(h) == [v3.name]
    exit_stopped(h)
    v2, v3 = sorted(live(h, "m"), key=lambda i: i.version)
    (repo / "m" / "1" / "model.py").write_text("# changed")   # version 1 is not selected: no change
    (repo / "m" / "2" / "model.py").write_text("# changed")
    cid = send(h, S.LoadModel("m"))
    assert [i.version for i in h.instances(state=InstanceState.STARTING)] == [2]
    h.up("m")
    assert reply(h, cid).error is None and h.broker.registry.get("m")[3].instances == [v3]
    exit_stopped(h)
    spec = repo / "m" / "config.pbtxt"
    spec.write_text(spec.read_text().replace("latest { num_versions: 2 }", "specific { versions: [1, 3] }"))
    cid = send(h, S.LoadModel("m"))
    h.up("m")
    assert reply(h, cid).error is None and sorted(table(h)) == [1, 3]
    h.tick()
    exit_stopped(h)
    assert sorted(i.version for i in live(h)) == [1, 3]
    no_orphans(h)


def test_unload_lets_queued_and_executing_requests_finish(repo):
    h = explicit(repo)
    (inst,) = h.instances("m")
    executing = h.infer("m", X=X)
    queued = h.infer("m", X=X)
    assert reply(h, send(h, S.UnloadModel("m"))).error is None
    assert table(h)[1].state is S.ModelState.UNLOADING and table(h)[1].unloaded
    refused = h.infer("m", X=X)
    assert h.replies()[refused].error.message == "Request for unknown model: 'm' has no available versions"
    finish(h, "m")
    finish(h, "m")
    assert h.replies()[executing].error is None and h.replies()[queued].error is None
    h.tick()
    e = table(h)[1]
    assert (e.state, e.reason) == (S.ModelState.UNAVAILABLE, "unloaded") and stopped(h) == [inst.name]
    h.die(inst, 0)
    h.tick()
    assert h.broker.registry.retiring == []


def test_the_unload_timeout_fails_what_is_left(repo):
    h = explicit(repo, model_unload_timeout_secs=2)
    (inst,) = h.instances("m")
    executing = h.infer("m", X=X)
    queued = h.infer("m", X=X)
    send(h, S.UnloadModel("m"))
    h.tick(2.5)
    why = "model 'm' version 1 was unloaded and the unload timeout of 2 s expired"
    assert h.replies()[queued].error.message == why
    assert h.pool.killed == [inst.name]
    h.die(inst, -9)
    assert h.replies()[executing].error.message == f"inference failed because model 'm' instance 'm_0' was stopped: {why}"
    h.tick()
    assert h.broker.registry.retiring == [] and table(h)[1].reason == "unloaded"


def test_operations_on_one_model_run_one_at_a_time_in_order(repo):
    h = explicit(repo)
    edit_config(repo, 'parameters { key: "tag" value: { string_value: "2" } }')
    first = send(h, S.LoadModel("m"))
    unload = send(h, S.UnloadModel("m"))
    again = send(h, S.LoadModel("m"))
    assert reply(h, unload) is None and reply(h, again) is None     # both wait for the first load
    h.up("m")
    assert reply(h, first).error is None and reply(h, unload).error is None
    assert table(h)[1].state is S.ModelState.LOADING                # the second load, in the table at
    h.up("m")                                                       # once since nothing serves
    assert reply(h, again).error is None and table(h)[1].state is S.ModelState.READY
    h.tick()
    exit_stopped(h)
    assert len(live(h, "m")) == 1
    no_orphans(h)


def test_too_many_waiting_operations_get_tritons_conflict_error(repo):
    h = explicit(repo)
    edit_config(repo, 'parameters { key: "tag" value: { string_value: "2" } }')
    send(h, S.LoadModel("m"))
    for _ in range(MAX_WAITING):
        send(h, S.UnloadModel("m"))
    err = reply(h, send(h, S.UnloadModel("m"))).error
    assert (err.code, err.message) == (
        Code.INTERNAL, "a related model 'm' to a load/unload request is currently loading or unloading")


def test_random_loads_and_unloads_leave_no_worker_behind(tmp_path):
    python_model(tmp_path, "a", ["X"], ["Y"])
    python_model(tmp_path, "b", ["X"], ["Y"])
    h = Harness(tmp_path, model_control_mode="explicit").load()
    rng = random.Random(7)
    for step in range(200):
        name = rng.choice("ab")
        if rng.random() < 0.5:
            if rng.random() < 0.3:
                (tmp_path / name / "config.pbtxt").write_text(
                    (tmp_path / name / "config.pbtxt").read_text() + " ")
            send(h, S.LoadModel(name))
        else:
            send(h, S.UnloadModel(name))
        if rng.random() < 0.5:
            h.up("*")
        if rng.random() < 0.3:
            exit_stopped(h)
        h.tick(0.01)
        no_orphans(h)
    for _ in range(5):
        h.up("*")
        h.tick()
    for name in "ab":
        send(h, S.UnloadModel(name))
    h.tick()
    exit_stopped(h)
    h.tick()
    assert live(h) == [] and h.broker.registry.retiring == [] and h.broker.model_ops.runner.idle()


def test_load_and_unload_codes_outside_explicit_mode_and_for_bad_names(repo):
    h = Harness(repo).load("*")
    for op in (S.LoadModel("m"), S.UnloadModel("m")):
        err = reply(h, send(h, op)).error
        assert (err.code, err.message) == (
            Code.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")
    h = explicit(repo)
    err = reply(h, send(h, S.LoadModel("nope"))).error
    assert (err.code, err.message) == (Code.INTERNAL, "failed to load 'nope', failed to poll from model repository")
    err = reply(h, send(h, S.LoadModel("../m"))).error
    assert (err.code, err.message) == (
        Code.INVALID_ARG, "invalid model name '../m', model name must not contain path traversal characters")
    assert reply(h, send(h, S.UnloadModel("nope"))).error is None


def test_a_model_without_versions_fails_with_tritons_text(repo):
    (repo / "empty").mkdir()
    (repo / "empty" / "config.pbtxt").write_text('backend: "python"')
    h = explicit(repo)
    err = reply(h, send(h, S.LoadModel("empty"))).error
    assert (err.code, err.message) == (
        Code.INVALID_ARG, "load failed for model 'empty': at least one version must be available under the "
                          "version policy of model 'empty'\n")


# ---------------------------------------------------------------------- the rate limiter

def shared(repo, name: str, priority: int = 0) -> None:
    python_model(repo, name, ["X"], ["Y"], "instance_group [{ count: 1 kind: KIND_CPU rate_limiter { "
                 f'resources [{{ name: "R" count: 1 }}] priority: {priority} }} }}]')


def test_instances_sharing_a_resource_execute_one_at_a_time(tmp_path):
    shared(tmp_path, "a")
    shared(tmp_path, "b")
    python_model(tmp_path, "c", ["X"], ["Y"])
    h = Harness(tmp_path, rate_limit="execution_count").load("*")
    ra, rb, rc = h.infer("a", X=X), h.infer("b", X=X), h.infer("c", X=X)
    assert [i.model for i, _ in h.executing("a") + h.executing("b") + h.executing("c")] == ["a", "c"]
    finish(h, "a")
    assert ra in h.replies() and [i.model for i, _ in h.executing("a") + h.executing("b")] == ["b"]
    finish(h, "b")
    finish(h, "c")
    assert all(h.replies()[r].error is None for r in (ra, rb, rc))


def test_without_the_rate_limiter_resources_are_ignored(tmp_path):
    shared(tmp_path, "a")
    shared(tmp_path, "b")
    h = Harness(tmp_path).load("*")
    h.infer("a", X=X)
    h.infer("b", X=X)
    assert len(h.executing("a") + h.executing("b")) == 2


def test_priority_gives_an_instance_proportionally_more_turns(tmp_path):
    shared(tmp_path, "hi", priority=1)
    shared(tmp_path, "lo", priority=3)
    h = Harness(tmp_path, rate_limit="execution_count").load("*")
    order = []
    for _ in range(12):
        h.infer("hi", X=X)
        h.infer("lo", X=X)
    for _ in range(12):
        ((inst, _),) = h.executing("hi") + h.executing("lo")
        order.append(inst.model)
        finish(h, inst.model)
    assert order[:8].count("hi") == 6


def test_too_few_resources_fail_the_load_with_tritons_text(tmp_path):
    python_model(tmp_path, "a", ["X"], ["Y"], "instance_group [{ count: 1 kind: KIND_CPU rate_limiter { "
                 'resources [{ name: "R" count: 4 }] } }]')
    h = Harness(tmp_path, rate_limit="execution_count", rate_limit_resources=["R:2"]).load("*")
    assert table(h, "a")[1].reason == ('Resource count for "R" is limited to 2 which will prevent scheduling of '
                                       'one or more model instances, the minimum required count is 4')


def test_explicit_mode_loads_what_load_model_names_at_startup(tmp_path):
    python_model(tmp_path, "a", ["X"], ["Y"])
    python_model(tmp_path, "b", ["X"], ["Y"])
    assert Harness(tmp_path, model_control_mode="explicit").load("*").broker.registry.models == {}
    h = Harness(tmp_path, model_control_mode="explicit", load_models=["b"]).load("*")
    assert list(h.broker.registry.models) == ["b"]
    h = Harness(tmp_path, model_control_mode="explicit", load_models=["*"]).load("*")
    assert sorted(h.broker.registry.models) == ["a", "b"] and h.broker.registry.startup_done
