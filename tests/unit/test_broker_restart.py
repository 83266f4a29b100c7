"""While the only instance of a model restarts, new requests wait in its queue (bounded by the
queue policy and a restart deadline) instead of getting 404; the model is not ready from the
moment its worker dies, and the table saying so reaches the frontends before the failed
batch's replies. Also: a dead frontend's output leases are released at once. All in the real
broker, driven in-process."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from broker_harness import Harness, ensemble_model, python_model

from tritond.broker.supervision.pool import BACKOFF_MIN, CRASH_LIMIT
from tritond.broker.supervision.restart_wait import RESTART_WAIT_S
from tritond.frontend.broker_client import ModelTable
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError

X = np.ones(2, np.float32)
ENSEMBLE = """
name: "ens" platform: "ensemble" max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [{ model_name: "m" model_version: -1 input_map { key: "X" value: "X" }
                              output_map { key: "Y" value: "Y" } }] }
"""


@pytest.fixture
def h(tmp_path) -> Harness:
    python_model(tmp_path, "m", ["X"], ["Y"])
    ensemble_model(tmp_path, "ens", ENSEMBLE)
    return Harness(tmp_path).load("*")


def frontend_table(h: Harness) -> ModelTable:
    """The model table as the frontends last received it."""
    return ModelTable(h.to_frontends(S.Table)[-1][1])


def kill_only_instance(h: Harness) -> None:
    h.from_frontend(S.Hello(S.PROTOCOL_VERSION, "http", 1))
    (inst,) = h.instances("m")
    h.die(inst, -9)


def serve_again(h: Harness) -> None:
    """The replacement worker comes up and answers whatever it is sent."""
    h.tick(BACKOFF_MIN * 2)
    h.up("m")
    while h.executing("m"):
        for inst, ex in h.executing("m"):
            h.answer(inst, ex, *({"Y": S.Inline(X.tobytes())} for _ in ex.requests))
    h.broker.publish_if_changed()


def test_the_frontends_learn_the_model_is_not_ready_before_its_batch_fails(h):
    h.from_frontend(S.Hello(S.PROTOCOL_VERSION, "http", 1))
    rid = h.infer("m", X=X)
    ((inst, _),) = h.executing("m")
    h.die(inst, -9)
    frames = [m for i, m in h.sockets.frontend if isinstance(m, (S.Table, S.InferReply))]
    failed = next(k for k, m in enumerate(frames) if isinstance(m, S.InferReply) and m.rid == rid)
    tables = [m for m in frames[:failed] if isinstance(m, S.Table)]
    assert tables, "no table was sent before the failed batch was answered"
    (e,) = [e for e in tables[-1].models if e.name == "m"]
    assert e.state is S.ModelState.UNAVAILABLE and e.restarting
    assert not ModelTable(tables[-1]).ready(strict=True)


def test_requests_during_a_restart_wait_for_the_instance_instead_of_404(h):
    kill_only_instance(h)
    table = frontend_table(h)
    entry = table.resolve("m", -1, restarting_ok=True)            # an inference goes through
    assert entry.restarting and entry.state is S.ModelState.UNAVAILABLE
    with pytest.raises(TritonError) as e:                          # readiness and metadata do not
        table.resolve("m", -1)
    assert e.value.code is Code.NOT_FOUND
    rids = [h.infer("m", X=X) for _ in range(3)]
    rids.append(h.infer("ens", X=X))                               # through an ensemble too
    assert not any(rid in h.replies() for rid in rids)
    serve_again(h)
    replies = h.replies()
    assert all(replies[rid].error is None for rid in rids), [replies.get(r) for r in rids]


def test_the_queue_policy_bounds_what_waits(tmp_path):
    python_model(tmp_path, "q", ["X"], ["Y"], max_batch_size=4, extra=(
        "dynamic_batching { default_queue_policy { max_queue_size: 2 } }"))
    h = Harness(tmp_path).load("*")
    (inst,) = h.instances("q")
    h.die(inst, -9)
    rids = [h.infer("q", X=np.ones((1, 2), np.float32)) for _ in range(3)]
    (refused,) = [r for r in rids if r in h.replies()]
    assert h.replies()[refused].error.code is Code.UNAVAILABLE
    assert "Exceeds maximum queue size" in h.replies()[refused].error.message


def test_a_restart_that_takes_too_long_fails_what_waits_with_503_naming_it(h):
    kill_only_instance(h)
    rid = h.infer("m", X=X)
    h.tick(RESTART_WAIT_S + 1)             # the replacement never says it is up
    err = h.replies()[rid].error
    assert err.code is Code.UNAVAILABLE
    assert err.message.startswith("model 'm' has no live instance (restarting): instance 'm_0' died "
                                  "(killed by signal 9 (SIGKILL))")
    assert err.message.endswith(f"it did not serve again within {RESTART_WAIT_S:g} s")
    late = h.infer("m", X=X)
    assert h.replies()[late].error == err
    serve_again(h)
    assert not frontend_table(h).resolve("m").restarting and run_ok(h)


def run_ok(h: Harness) -> bool:
    rid = h.infer("m", X=X)
    ((inst, ex),) = h.executing("m")
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    return h.replies()[rid].error is None


def test_a_crash_loop_fails_what_waits_and_the_model_is_no_longer_restarting(h):
    kill_only_instance(h)
    rid = h.infer("m", X=X)
    (inst,) = h.instances("m")
    for _ in range(CRASH_LIMIT):
        h.tick(1.0)
        h.die(inst, 3)
    assert h.replies()[rid].error.code is Code.UNAVAILABLE
    assert "failed 6 times within 60 s" in h.replies()[rid].error.message
    with pytest.raises(TritonError) as e:
        frontend_table(h).resolve("m", -1, restarting_ok=True)
    assert e.value.code is Code.NOT_FOUND


def test_unloading_during_a_restart_fails_what_waits(tmp_path):
    python_model(tmp_path, "m", ["X"], ["Y"])
    h = Harness(tmp_path, model_control_mode="explicit", load_models=["m"]).load("*")
    kill_only_instance(h)
    rid = h.infer("m", X=X)
    assert h.control(S.UnloadModel("m")).error is None
    assert h.replies()[rid].error.message == ("model 'm' version 1 was unloaded and has no instance left to "
                                              "run the request")
    h.broker.publish_table()
    with pytest.raises(TritonError):
        frontend_table(h).resolve("m", -1, restarting_ok=True)


def test_a_dead_frontends_output_leases_are_released_at_once(h):
    frontend = subprocess.Popen(["sleep", "60"])
    try:
        h.from_frontend(S.Hello(S.PROTOCOL_VERSION, "http", frontend.pid), b"fe1")
        (inst,) = h.instances("m")
        rids = [h.infer("m", b"fe1", X=X) for _ in range(2)]
        for rid in rids:
            ((inst, ex),) = h.executing("m")
            h.answer(inst, ex, {"Y": S.Block("tritond.x.w1.a", 0, 8, lease=7 + rid)})
        h.from_frontend(S.Release(inst.identity, [7 + rids[0]]), b"fe1")    # the first one it rendered
        assert h.released() == [(inst.identity, 7 + rids[0])]
        (fd,) = h.broker.frontend_leases.pidfds()
        frontend.kill()
        frontend.wait()
        h.broker.on_frontend_exit(fd)
        assert h.released() == sorted([(inst.identity, 7 + rids[0]), (inst.identity, 7 + rids[1])])
        late = h.infer("m", b"fe1", X=X)                   # a reply for the dead frontend: freed, not sent
        ((inst, ex),) = h.executing("m")
        h.answer(inst, ex, {"Y": S.Block("tritond.x.w1.a", 0, 8, lease=99)})
        assert (inst.identity, 99) in h.released() and late not in h.replies(b"fe1")
    finally:
        frontend.kill()
        frontend.wait()
