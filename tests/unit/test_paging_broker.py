"""Model paging in the real broker, in-process with a fake clock and stand-in workers whose
memory the test decides: a request pages its model in and waits for it; the least recently used
idle model leaves when the budget is full, a busy one never does; a model paged out while asked
for again is paged in again; a failed load answers what waited and backs off; a model measured
bigger than the budget is refused; pinned models are never the pager's."""
from __future__ import annotations

import time

import numpy as np
import pytest
from broker_harness import Harness, ensemble_model, python_model

from tritond.broker.paging import pager as pager_module
from tritond.broker.supervision.pool import InstanceState
from tritond.wire import schema as S
from tritond.wire.errors import Code

X = np.ones(2, np.float32)
SIZE = 100
BUDGET = 3 * SIZE
MEASURE = pager_module.MEASURE_S      # every process measured again (a page-in is measured at its next turn)
TURN = 0.5


@pytest.fixture
def h(tmp_path, monkeypatch) -> Harness:
    repo = tmp_path / "models"
    for name in ("a", "b", "c", "d", "bad", "huge"):
        python_model(repo, name, ["INPUT0"], ["OUTPUT0"])
    python_model(repo, "pinned", ["INPUT0"], ["OUTPUT0"],
                 'parameters { key: "paging_pinned" value { string_value: "true" } }')
    sizes = {"huge": 10 * BUDGET}

    def models_pss(pids):       # what the test says each model's workers take
        return {name: sizes.get(name, SIZE) for name in pids}

    monkeypatch.setattr(pager_module, "models_pss", models_pss)
    monkeypatch.setattr(pager_module, "pss_bytes", lambda pid: 0)
    harness = Harness(repo, model_control_mode="paged", model_memory_budget=BUDGET)
    monkeypatch.setattr(time, "time", lambda: harness.clock.t)     # executions' wall-clock stamps follow the fake clock
    return harness.load("pinned")


def state(h: Harness, name: str) -> S.ModelState:
    return h.broker.registry.get(name)[1].state


def serve(h: Harness, name: str) -> S.InferReply:
    """One request for `name`: paged in if it must be (the workers paged out for it exit first),
    executed, answered; the clock moves on."""
    rid = h.infer(name, INPUT0=X)
    h.tick()
    exit_stopped(h)
    h.up(name)
    for inst, batch in h.executing(name):
        h.answer(inst, batch, {"OUTPUT0": S.Inline(X.tobytes())})
    h.tick(TURN)
    return h.replies()[rid]


def exit_stopped(h: Harness) -> None:
    """The workers asked to stop exit; the next turn sees it."""
    for inst in h.instances(state=InstanceState.STOPPING):
        h.die(inst, 0)
    h.tick()


def test_models_start_paged_out_and_a_request_pages_one_in(h):
    assert state(h, "a") is S.ModelState.UNAVAILABLE
    assert h.broker.registry.get("a")[1].reason.startswith("paged out")
    assert state(h, "pinned") is S.ModelState.READY
    assert not h.instances("a", InstanceState.STARTING)
    rid = h.infer("a", INPUT0=X)
    h.tick()
    assert state(h, "a") is S.ModelState.LOADING
    assert rid not in h.replies()       # it waits in the model's queue
    h.up("a")
    (inst, batch), = h.executing("a")
    h.answer(inst, batch, {"OUTPUT0": S.Inline(X.tobytes())})
    assert h.replies()[rid].error is None
    h.tick(TURN)
    assert state(h, "a") is S.ModelState.READY
    assert h.broker.model_ops.pager.sizes.known == {"a": SIZE}


def test_the_least_recently_used_idle_model_leaves_when_the_budget_is_full(h):
    for name in ("a", "b", "c"):
        assert serve(h, name).error is None
    assert serve(h, "a").error is None      # a is used again: b is the least recent now
    rid = h.infer("d", INPUT0=X)
    h.tick()
    assert state(h, "b") is S.ModelState.UNAVAILABLE
    assert h.to_workers(S.Stop)
    assert state(h, "d") is S.ModelState.UNAVAILABLE       # it waits for b's worker to exit
    exit_stopped(h)
    assert state(h, "d") is S.ModelState.LOADING
    h.up("d")
    (inst, batch), = h.executing("d")
    h.answer(inst, batch, {"OUTPUT0": S.Inline(X.tobytes())})
    assert h.replies()[rid].error is None
    assert [state(h, n) for n in ("a", "c", "d")] == [S.ModelState.READY] * 3
    assert serve(h, "b").error is None      # paged out, asked for again: paged in again
    assert h.broker.model_ops.pager.models["b"].page_ins == 2
    assert state(h, "pinned") is S.ModelState.READY


def test_a_busy_model_is_not_paged_out_and_the_page_in_waits_for_room(h):
    for name in ("a", "b", "c"):
        serve(h, name)
    busy = [h.infer(n, INPUT0=X) for n in ("a", "b", "c")]     # each executing now
    waiting = h.infer("d", INPUT0=X)
    h.tick()
    assert state(h, "d") is S.ModelState.UNAVAILABLE and not h.instances("d", InstanceState.STARTING)
    (inst, batch), = h.executing("b")
    h.answer(inst, batch, {"OUTPUT0": S.Inline(X.tobytes())})
    h.tick()
    assert state(h, "b") is S.ModelState.UNAVAILABLE       # the first to become idle makes room
    exit_stopped(h)
    assert state(h, "d") is S.ModelState.LOADING
    h.up("d")
    for inst, batch in h.executing("d"):
        h.answer(inst, batch, {"OUTPUT0": S.Inline(X.tobytes())})
    replies = h.replies()
    assert replies[waiting].error is None and replies[busy[1]].error is None


def test_a_failed_load_answers_what_waited_and_is_not_retried_within_its_backoff(h):
    rid = h.infer("bad", INPUT0=X)
    h.tick()
    inst, = h.instances("bad", InstanceState.STARTING)
    h.from_worker(inst, S.WorkerDown("initialize raised: no weights"))
    h.tick()
    err = h.replies()[rid].error
    assert err.code is Code.UNAVAILABLE and "no weights" in err.message
    again = h.infer("bad", INPUT0=X)
    assert "tried again in" in h.replies()[again].error.message
    assert h.broker.model_ops.pager.models["bad"].page_ins == 1
    h.die(inst)
    h.tick(pager_module.backoff_s(1))
    h.infer("bad", INPUT0=X)
    h.tick()
    assert h.instances("bad", InstanceState.STARTING)       # after the backoff it is tried again
    assert h.broker.model_ops.pager.models["bad"].page_ins == 2


def test_a_model_bigger_than_the_budget_is_refused(h):
    serve(h, "huge")                        # measured after its first load
    h.tick(MEASURE)
    assert state(h, "huge") is S.ModelState.UNAVAILABLE
    exit_stopped(h)
    rid = h.infer("huge", INPUT0=X)
    err = h.replies()[rid].error
    assert err.code is Code.UNAVAILABLE and "more than the --model-memory-budget" in err.message
    assert h.broker.model_ops.pager.models["huge"].page_ins == 1


def test_statistics_and_metrics_carry_paging(h):
    serve(h, "a")
    reply = h.control(S.Statistics("a", -1)).result
    paging = reply.paging["a"]
    assert paging.resident and paging.page_ins == 1 and paging.first_response_count == 1
    assert reply.model_stats[0].memory_usage[0].byte_size == SIZE
    out = h.control(S.Statistics("b", -1)).result       # paged out: listed too
    assert out.model_stats[0].name == "b" and out.paging["b"].resident is False
    snap = h.control(S.ModelMetrics()).result.paging
    assert (snap.budget, snap.used, snap.resident) == (BUDGET, SIZE, 1)
    assert snap.first_response.count == 1


def test_an_ensemble_and_what_it_composes_are_pinned_and_load_model_pins_too(tmp_path):
    repo = tmp_path / "models"
    python_model(repo, "step", ["IN"], ["OUT"])
    python_model(repo, "named", ["INPUT0"], ["OUTPUT0"])
    python_model(repo, "other", ["INPUT0"], ["OUTPUT0"])
    ensemble_model(repo, "ens", 'name: "ens" platform: "ensemble" max_batch_size: 0 '
                                'input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }] '
                                'output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }] '
                                'ensemble_scheduling { step [ { model_name: "step" model_version: -1 '
                                'input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }')
    h = Harness(repo, model_control_mode="paged", model_memory_budget=BUDGET, load_models=["named"]).load("*")
    assert {n: state(h, n) for n in ("step", "named", "ens", "other")} == {
        "step": S.ModelState.READY, "named": S.ModelState.READY, "ens": S.ModelState.READY,
        "other": S.ModelState.UNAVAILABLE}
    assert set(h.broker.model_ops.pager.models) == {"other"}


GPU_SIZE = 1000
GPU_GROUP = 'instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]'


@pytest.fixture
def gpu(tmp_path, monkeypatch) -> Harness:
    """Three models on GPU 0 under a GPU budget for two (host memory to spare), a CPU model, and
    one on GPU 1, which has no budget; NVML stands in as what the test says each worker holds."""
    from tritond.repository import devices
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    repo = tmp_path / "models"
    for name in ("g1", "g2", "g3"):
        python_model(repo, name, ["INPUT0"], ["OUTPUT0"], GPU_GROUP)
    python_model(repo, "cpu", ["INPUT0"], ["OUTPUT0"], 'instance_group [{ kind: KIND_CPU count: 1 }]')
    python_model(repo, "other_gpu", ["INPUT0"], ["OUTPUT0"], GPU_GROUP.replace("[0]", "[1]"))
    holder: dict[str, Harness] = {}

    class FakeNvml:
        def __init__(self, gpus):
            assert list(gpus) == [0]

        def read(self):     # every live worker of a GPU model holds GPU_SIZE on GPU 0
            return {pid: {0: GPU_SIZE} for pid, inst in holder["h"].pool.live.items() if inst.kind == "GPU"}

    monkeypatch.setattr(pager_module, "DeviceMemory", FakeNvml)
    monkeypatch.setattr(pager_module, "models_pss", lambda pids: {name: SIZE for name in pids})
    monkeypatch.setattr(pager_module, "pss_bytes", lambda pid: 0)
    harness = Harness(repo, model_control_mode="paged", model_memory_budget=10 * SIZE,
                      model_gpu_memory_budget={0: 2 * GPU_SIZE})
    holder["h"] = harness
    monkeypatch.setattr(time, "time", lambda: harness.clock.t)
    return harness.load("*")


def test_gpu_models_page_within_their_gpus_budget(gpu):
    pager = gpu.broker.model_ops.pager
    for name in ("g1", "g2", "cpu"):
        assert serve(gpu, name).error is None
    assert pager.used_on(0) == 2 * GPU_SIZE
    assert pager.devices.sizes[0].known == {"g1": GPU_SIZE, "g2": GPU_SIZE}
    assert serve(gpu, "g3").error is None          # GPU 0 is full: g1, the least recently used there, leaves
    assert [state(gpu, n) for n in ("g1", "g2", "g3", "cpu")] == [
        S.ModelState.UNAVAILABLE, S.ModelState.READY, S.ModelState.READY, S.ModelState.READY]
    assert pager.used_on(0) == 2 * GPU_SIZE


def test_a_gpu_without_a_budget_keeps_its_models_unavailable(gpu):
    mv = gpu.broker.registry.get("other_gpu")[1]
    assert mv.state is S.ModelState.UNAVAILABLE
    assert "GPU 1, which has no --model-gpu-memory-budget" in mv.reason
    rid = gpu.infer("other_gpu", INPUT0=X)
    assert gpu.replies()[rid].error is not None


def test_gpu_budgets_and_what_gpu_models_hold_are_reported(gpu):
    serve(gpu, "g1")
    snap = gpu.control(S.ModelMetrics()).result.paging
    assert snap.gpus == {0: (2 * GPU_SIZE, GPU_SIZE)}
    g1 = next(m for m in snap.models if m.name == "g1")
    assert g1.gpu_memory == {0: GPU_SIZE}
