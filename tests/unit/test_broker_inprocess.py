"""The broker's supervision, request path and drain, driven in-process with a fake clock:
worker exits, hangs and overruns, restart backoff and crash loops, retries, protocol
versions, unload and drain, each decided by the real broker code."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.broker.supervision.pool import BACKOFF_MIN, CRASH_LIMIT, Instance, InstanceState, record_crash
from tritond.broker.supervision.watch import HEARTBEAT_TIMEOUT_S
from tritond.wire import replies as R
from tritond.wire import schema as S
from tritond.wire.errors import Code

X = np.ones(2, np.float32)


@pytest.fixture
def repo(tmp_path):
    python_model(tmp_path, "m", ["X"], ["Y"])
    return tmp_path


def model(h: Harness, name: str = "m"):
    (mv,) = h.broker.registry.get(name).values()
    return mv


def table(h: Harness) -> S.Table:
    return h.broker.registry.table(False, 0)


def entry(h: Harness, name: str = "m") -> S.ModelEntry:
    (e,) = [e for e in table(h).models if e.name == name]
    return e


def run_one(h: Harness, name: str = "m") -> int:
    rid = h.infer(name, X=X)
    ((inst, ex),) = h.executing(name)
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    return rid


def test_a_model_is_ready_once_its_worker_is_up_and_serves_through_it(repo):
    h = Harness(repo).load()
    assert entry(h).state is S.ModelState.LOADING and not h.broker.registry.startup_done
    h.up("m")
    assert entry(h).state is S.ModelState.READY and h.broker.registry.startup_done
    assert entry(h).view.inputs["X"].datatype == "FP32"
    rid = run_one(h)
    reply = h.replies()[rid]
    assert reply.error is None and reply.outputs[0].name == "Y"
    assert model(h).stats.success.count == 1 and model(h).stats.execution_count == 1


def test_a_dead_worker_fails_its_batch_then_restarts_with_backoff(repo):
    h = Harness(repo).load("*")
    rid = h.infer("m", X=X)
    ((inst, _),) = h.executing("m")
    first = inst.identity
    h.die(inst, -9)
    err = h.replies()[rid].error
    assert err.code is Code.UNAVAILABLE
    assert err.message == ("inference failed because model 'm' instance 'm_0' died "
                           "(killed by signal 9 (SIGKILL))")
    assert inst.state is InstanceState.RESTARTING and entry(h).state is S.ModelState.UNAVAILABLE
    assert "restarting" in entry(h).reason
    h.tick(BACKOFF_MIN / 2)
    assert inst.state is InstanceState.RESTARTING            # still backing off
    h.tick(BACKOFF_MIN)
    assert inst.state is InstanceState.STARTING and inst.identity != first
    h.from_worker(Instance("m", 1, 0, "m_0", generation=0), S.WorkerUp(S.PROTOCOL_VERSION, 1))  # a stranger
    assert inst.state is InstanceState.STARTING
    h.up("m")
    assert entry(h).state is S.ModelState.READY and inst.restarts == 1
    rid = run_one(h)
    assert h.replies()[rid].error is None


def test_queued_requests_wait_for_the_restarted_worker(repo):
    h = Harness(repo).load("*")
    first = h.infer("m", X=X)
    ((inst, _),) = h.executing("m")
    queued = h.infer("m", X=X)
    h.die(inst)
    assert first in h.replies() and queued not in h.replies()
    h.tick(1.0)
    h.up("m")
    ((inst, ex),) = h.executing("m")
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    assert h.replies()[queued].error is None


def test_a_crash_loop_marks_the_instance_failed(repo):
    h = Harness(repo).load("*")
    (inst,) = h.instances("m")
    for _ in range(CRASH_LIMIT + 1):
        h.die(inst, 3)
        h.tick(10.0)
        if inst.state is InstanceState.FAILED:
            break
    assert inst.state is InstanceState.FAILED
    assert entry(h).state is S.ModelState.UNAVAILABLE
    assert f"failed {CRASH_LIMIT + 1} times within 60 s without serving" in entry(h).reason
    assert "last: died (exit code 3)" in entry(h).reason


def test_backoff_doubles_and_serving_clears_the_count():
    inst = Instance("m", 1, 0, "m_0")
    delays = []
    for t in range(4):
        assert record_crash(inst, float(t))
        delays.append(round(inst.restart_at - t, 3))
    assert delays == [BACKOFF_MIN, 2 * BACKOFF_MIN, 4 * BACKOFF_MIN, 8 * BACKOFF_MIN]
    inst.served = True
    assert record_crash(inst, 10.0) and inst.crashes.times == [10.0]


def test_a_silent_worker_is_killed_and_replaced(repo):
    h = Harness(repo).load("*")
    (inst,) = h.instances("m")
    h.tick(HEARTBEAT_TIMEOUT_S - 1)
    h.from_worker(inst, S.Heartbeat(), heartbeat=True)          # the heartbeat socket counts
    h.tick(2.0)
    assert h.pool.killed == []
    h.tick(HEARTBEAT_TIMEOUT_S)
    assert h.pool.killed == ["m_0"] and inst.state is InstanceState.KILLED
    h.die(inst, -9)
    assert "sent no heartbeat for 3 s" in inst.last_error and inst.state is InstanceState.RESTARTING


def test_an_overrunning_batch_is_killed_at_the_models_deadline(tmp_path):
    python_model(tmp_path, "slow", ["X"], ["Y"],
                 'parameters { key: "execution_timeout_seconds" value: { string_value: "1" } }')
    h = Harness(tmp_path).load("*")
    rid = h.infer("slow", X=X)
    ((inst, _),) = h.executing("slow")
    for _ in range(3):                       # heartbeats keep coming: it is busy, not hung
        h.tick(0.5)
        h.from_worker(inst, S.Heartbeat(), heartbeat=True)
    assert h.pool.killed == ["slow_0"]
    h.die(inst)
    assert "exceeded the execution timeout of 1 s" in h.replies()[rid].error.message


def test_an_idempotent_models_requests_are_retried_once(tmp_path):
    python_model(tmp_path, "idem", ["X"], ["Y"], 'parameters { key: "idempotent" value: { string_value: "true" } }')
    h = Harness(tmp_path).load("*")
    rid = h.infer("idem", X=X)
    ((inst, _),) = h.executing("idem")
    h.die(inst)
    assert rid not in h.replies()
    h.tick(1.0)
    h.up("idem")
    ((inst, ex),) = h.executing("idem")
    h.die(inst)                               # a second death fails it
    assert h.replies()[rid].error.code is Code.UNAVAILABLE


def test_a_model_that_fails_to_initialize_is_unavailable_with_the_reason(repo):
    h = Harness(repo).load()
    (inst,) = h.instances("m")
    h.from_worker(inst, S.WorkerDown("ValueError: bad weights"))
    assert entry(h).state is S.ModelState.UNAVAILABLE
    assert entry(h).reason == "load failed for model 'm': ValueError: bad weights"
    assert h.broker.registry.startup_done
    h.die(inst, 1)
    assert inst.state is InstanceState.FAILED


def test_peers_of_another_protocol_version_are_refused(repo):
    h = Harness(repo).load()
    h.from_frontend(S.Hello(S.PROTOCOL_VERSION + 1, "http", 1), b"old")
    ((_, refused),) = [(i, m) for i, m in h.sockets.frontend if i == b"old"]
    assert isinstance(refused, S.Refused) and "protocol version" in refused.reason
    assert b"old" not in h.broker.frontends
    (inst,) = h.instances("m")
    h.from_worker(inst, S.WorkerUp(S.PROTOCOL_VERSION + 1, inst.pid))
    assert h.pool.killed == ["m_0"]
    h.die(inst, -9)
    assert "speaks protocol version" in entry(h).reason


def test_frames_that_do_not_decode_are_dropped(repo):
    h = Harness(repo).load("*")
    (inst,) = h.instances("m")
    h.broker.on_worker_frame(inst.identity, b"\xc1junk")
    h.broker.on_frontend_frame(b"fe", b"\x93\xa5infer")
    assert h.replies() == {} and entry(h).state is S.ModelState.READY


def test_unload_stops_the_workers_and_says_so_in_the_table(repo):
    h = Harness(repo, model_control_mode="explicit", load_models=["m"]).load("*")
    (inst,) = h.instances("m")
    assert h.control(S.UnloadModel("m")).error is None
    assert (inst.identity, S.Stop()) in h.to_workers(S.Stop)
    e = entry(h)
    assert (e.state, e.unloaded, e.reason) == (S.ModelState.UNAVAILABLE, True, "unloaded")
    h.die(inst, 0)
    assert inst.state is InstanceState.STOPPED


def test_a_drain_lets_in_flight_work_finish_and_refuses_new_requests(repo):
    h = Harness(repo).load("*")
    rid = h.infer("m", X=X)
    assert h.control(S.Drain()) is None                      # answered when the drain ends
    assert table(h).models and h.broker.drain.stopping
    refused = h.infer("m", X=X)
    assert h.replies()[refused].error.message == "Server is shutting down and has stopped accepting new requests"
    h.tick()
    assert not h.to_frontends(S.ControlReply)
    ((inst, ex),) = h.executing("m")
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    h.tick()
    ((_, done),) = h.to_frontends(S.ControlReply)
    assert done.result == R.DrainReply(True) and h.replies()[rid].error is None


def test_at_the_exit_timeout_what_is_in_flight_is_cancelled(repo):
    h = Harness(repo, exit_timeout_secs=5).load("*")
    rid = h.infer("m", X=X)
    h.control(S.Drain())
    h.tick(6.0)
    ((_, done),) = h.to_frontends(S.ControlReply)
    assert done.result == R.DrainReply(False)
    assert h.replies()[rid].error.message == "Server is shutting down: the exit timeout expired"


def test_a_reaped_worker_leaves_nothing_to_poll(repo):
    h = Harness(repo).load("*")
    (inst,) = h.instances("m")
    fd = inst.pidfd
    h.die(inst)
    assert fd not in h.broker.instances.pidfds() and h.broker.instances.get(inst.identity) is None
