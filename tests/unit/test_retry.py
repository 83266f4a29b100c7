"""A killed batch run again (broker/scheduling/retry.py, repository/idempotent.py): driven
in-process with a fake clock, so each decision (retry once, in order; both reasons on a second
death; not for a cancelled or timed-out request; not for a model that did not opt in) is the
real broker's, and the load refuses the models whose executions cannot repeat."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, python_model

from tritond.broker.supervision.pool import BACKOFF_MAX, CRASH_LIMIT, InstanceState
from tritond.repository import devices
from tritond.repository.catalog import load_spec
from tritond.repository.layout import ModelSource
from tritond.wire import schema as S
from tritond.wire.errors import Code

X = np.ones(2, np.float32)
IDEMPOTENT = 'parameters { key: "idempotent" value: { string_value: "true" } }'
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 0 }"


def harness(tmp_path, extra: str = IDEMPOTENT) -> Harness:
    python_model(tmp_path, "m", ["X"], ["Y"], f"{BATCHING} {extra}", max_batch_size=8)
    return Harness(tmp_path).load("*")


def request(h: Harness, request_id: str, timeout_us: int = 0) -> S.Infer:
    desc = S.TensorDesc("X", "FP32", [1, 2], S.Inline(X.tobytes()))
    return S.Infer(next(h.rids), "m", -1, [desc], [], id=request_id, timeout_us=timeout_us)


def send(h: Harness, *request_ids: str, timeout_us: int = 0) -> list[int]:
    """Requests that arrive in one turn of the broker's loop (so they form one batch)."""
    msgs = [request(h, i, timeout_us) for i in request_ids]
    h.from_frontend_turn(*msgs)
    return [m.rid for m in msgs]


def stats(h: Harness):
    (mv,) = h.broker.registry.get("m").values()
    return mv.stats


def batch_ids(exec_msg: S.Exec) -> list[str]:
    return [r.id for r in exec_msg.requests]


def restart(h: Harness) -> tuple:
    h.tick(1.0)
    h.up("m")
    ((inst, ex),) = h.executing("m")
    return inst, ex


def test_a_lost_batch_runs_again_once_in_its_order_and_a_second_death_names_both(tmp_path, caplog):
    h = harness(tmp_path)
    rids = send(h, "r0", "r1", "r2")
    ((inst, ex),) = h.executing("m")
    assert batch_ids(ex) == ["r0", "r1", "r2"]
    h.die(inst)
    assert not set(rids) & set(h.replies())
    assert stats(h).retries == 3
    assert "running 3 request(s) again after instance 'm_0' died (killed by signal 9 (SIGKILL)): " \
           "request id(s) r0, r1, r2" in caplog.text
    inst, ex = restart(h)
    assert batch_ids(ex) == ["r0", "r1", "r2"]
    h.die(inst, 7)
    for rid in rids:
        err = h.replies()[rid].error
        assert err.code is Code.UNAVAILABLE
        assert err.message == ("inference failed because model 'm' instance 'm_0' died (exit code 7) while "
                               "running it again after instance 'm_0' died (killed by signal 9 (SIGKILL))")
    assert (stats(h).retries, stats(h).retry_failures) == (3, 3)
    [rid] = send(h, "after")
    inst, ex = restart(h)
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    assert h.replies()[rid].error is None


def test_a_retried_request_that_succeeds_counts_no_failure(tmp_path):
    h = harness(tmp_path)
    [rid] = send(h, "once")
    ((inst, _),) = h.executing("m")
    h.die(inst)
    inst, ex = restart(h)
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    assert h.replies()[rid].error is None
    assert (stats(h).retries, stats(h).retry_failures) == (1, 0)
    assert stats(h).success.count == 1


def test_a_request_whose_client_left_is_not_run_again(tmp_path):
    h = harness(tmp_path)
    gone, kept = send(h, "gone", "kept")
    ((inst, _),) = h.executing("m")
    h.from_frontend(S.Cancel(gone))
    h.die(inst)
    assert h.replies()[gone].error.code is Code.CANCELLED
    assert kept not in h.replies()
    _, ex = restart(h)
    assert batch_ids(ex) == ["kept"]
    assert stats(h).failures["CANCELED"] == 1


def test_a_request_whose_timeout_passed_is_not_run_again(tmp_path):
    h = harness(tmp_path)
    [late] = send(h, "late", timeout_us=500_000)
    ((inst, _),) = h.executing("m")
    h.clock.advance(1.0)
    h.die(inst)
    err = h.replies()[late].error
    assert err.code is Code.UNAVAILABLE
    assert err.message == ("inference failed because model 'm' instance 'm_0' died (killed by signal 9 (SIGKILL)); "
                           "not run again: its timeout of 500000 us has passed")
    assert stats(h).retries == 0


def test_a_model_that_did_not_opt_in_fails_its_lost_batch(tmp_path):
    h = harness(tmp_path, "")
    [rid] = send(h, "plain")
    ((inst, _),) = h.executing("m")
    h.die(inst)
    assert h.replies()[rid].error.message == "inference failed because model 'm' instance 'm_0' died " \
                                             "(killed by signal 9 (SIGKILL))"
    assert stats(h).retries == 0


BASE = ('backend: "python" max_batch_size: 4 '
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ 2 ] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2 ] }] ')


def spec_error(root, config: str, value: str = "true") -> str:
    path = root / "m"
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text("")
    (path / "config.pbtxt").write_text(config + f' parameters {{ key: "idempotent" value: {{ string_value: "{value}" }} }}')
    return load_spec(ModelSource("m", str(path), str(root))).error


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes", "on", "false", "0", "no", "off"])
def test_the_parameter_takes_tritons_boolean_spellings(tmp_path, no_gpu, value):
    assert spec_error(tmp_path, BASE, value) == ""


def test_a_value_that_is_not_a_boolean_fails_the_load(tmp_path, no_gpu):
    assert "field 'parameters.idempotent': parameter 'idempotent' must be true or false, got 'maybe'" in \
        spec_error(tmp_path, BASE, "maybe")


@pytest.mark.parametrize("extra, why", [
    ("sequence_batching { }", "a sequence-batched model cannot set 'idempotent'"),
    ("model_transaction_policy { decoupled: true }", "a decoupled model cannot set 'idempotent'"),
])
def test_models_whose_executions_cannot_repeat_fail_the_load(tmp_path, no_gpu, extra, why):
    assert why in spec_error(tmp_path, BASE + extra)
    assert spec_error(tmp_path / "off", BASE + extra, "false") == ""


def test_an_ensemble_cannot_set_it(tmp_path, no_gpu):
    ensemble = ('platform: "ensemble" max_batch_size: 4 '
                'input [{ name: "x" data_type: TYPE_FP32 dims: [ 2 ] }] '
                'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2 ] }] '
                'ensemble_scheduling { step [{ model_name: "s" model_version: -1 '
                'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } }] }')
    assert "an ensemble cannot set 'idempotent': its steps are retried by their own models'" in \
        spec_error(tmp_path, ensemble)


def test_poison_requests_still_trip_the_crash_loop_circuit(tmp_path):
    """Each poison request costs two deaths, never more, and the deaths count as before: the
    instance is marked failed after CRASH_LIMIT + 1 of them without serving."""
    h = harness(tmp_path)
    deaths, rids = 0, []
    while deaths <= CRASH_LIMIT:
        if not h.executing("m"):
            rids += send(h, f"p{deaths}")
        ((inst, _),) = h.executing("m")
        h.die(inst)
        deaths += 1
        if inst.state is InstanceState.FAILED:
            break
        h.tick(BACKOFF_MAX)
        h.up("m")
    assert deaths == CRASH_LIMIT + 1 and inst.state is InstanceState.FAILED
    assert all(h.replies()[rid].error.code is Code.UNAVAILABLE for rid in rids)
    assert stats(h).retries == len(rids) == 3 and stats(h).retry_failures == 3
    assert f"failed {CRASH_LIMIT + 1} times within 60 s without serving" in inst.last_error
