"""The broker's ensemble runner, in the real broker driven in-process: which steps start when,
which descriptors each step gets, and that every lease on an intermediate is released exactly
once on every path (success, failing step, cancelled sibling, outputs from several workers);
and the BLS deadlock check."""
from __future__ import annotations

import numpy as np
import pytest
from broker_harness import Harness, ensemble_model, python_model
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.broker.ensembles.plan import Plan
from tritond.broker.supervision.pool import InstanceState
from tritond.repository.render import config_to_json
from tritond.wire import schema as S
from tritond.wire.errors import Code

DIAMOND = """
name: "diamond" platform: "ensemble" max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "SUM" data_type: TYPE_FP32 dims: [-1] }, { name: "LT" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "split" model_version: -1 input_map { key: "IN" value: "IN" }
    output_map { key: "A" value: "a" } output_map { key: "B" value: "b" } },
  { model_name: "left" model_version: -1 input_map { key: "A" value: "a" }
    output_map { key: "L" value: "l" } output_map { key: "LT" value: "LT" } },
  { model_name: "right" model_version: -1 input_map { key: "B" value: "b" } output_map { key: "R" value: "r" } },
  { model_name: "join" model_version: -1 input_map { key: "L" value: "l" } input_map { key: "R" value: "r" }
    output_map { key: "SUM" value: "SUM" } }
] }
"""
OUTER = """
name: "outer" platform: "ensemble"
input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "diamond" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "SUM" value: "s" } },
  { model_name: "right" model_version: -1 input_map { key: "B" value: "s" } output_map { key: "R" value: "OUT" } }
] }
"""
COMPOSING = {
    "split": (["IN"], ["A", "B"]),
    "left": (["A"], ["L", "LT"]),
    "right": (["B"], ["R"]),
    "join": (["L", "R"], ["SUM"]),
}
IN = np.zeros(1, np.float32)


@pytest.fixture
def h(tmp_path) -> Harness:
    for name, (ins, outs) in COMPOSING.items():
        python_model(tmp_path, name, ins, outs)
    ensemble_model(tmp_path, "diamond", DIAMOND)
    ensemble_model(tmp_path, "outer", OUTER)
    return Harness(tmp_path).load("*")


def ident(h: Harness, model: str) -> bytes:
    (inst,) = h.instances(model)
    return inst.identity


def step(h: Harness, model: str) -> S.ExecRequest:
    ((_, ex),) = h.executing(model)
    (req,) = ex.requests
    return req


def answer(h: Harness, model: str, error: str = "", lease: int = 0, **outputs) -> None:
    """The worker of `model` answers its batch. An output given as an int is the offset of a large
    one; as a worker does, all large outputs of one reply share the reply's `lease`."""
    ((inst, ex),) = h.executing(model)
    if error:
        h.answer(inst, ex, S.ExecResult(error=S.TritonError(Code.INTERNAL, error)))
        return
    h.answer(inst, ex, {n: S.Block("/s", v, 4, lease) if isinstance(v, int) else S.Inline(v)
                        for n, v in outputs.items()})


def running(h: Harness) -> list[str]:
    return sorted(m for m in COMPOSING if h.executing(m))


def infer_diamond(h: Harness, *wanted: str) -> int:
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "diamond", -1, [S.TensorDesc("IN", "FP32", [1], S.Inline(IN.tobytes()))],
                            [S.OutputSpec(n) for n in wanted], "req-1", {"k": "v"}, 3, 500, 0, 0))
    return rid


def test_plan_knows_producers_consumers_and_needed_steps():
    plan = Plan(config_to_json(text_format.Parse(DIAMOND, model_config_pb2.ModelConfig())))
    assert plan.producer == {"a": 0, "b": 0, "l": 1, "LT": 1, "r": 2, "SUM": 3}
    assert plan.consumers == {"IN": [0], "a": [1], "b": [2], "l": [3], "r": [3]}
    assert plan.needed(("LT",)) == ((True, True, False, False), {"LT", "a", "IN"})
    assert plan.needed(("SUM",))[0] == (True, True, True, True)


def test_steps_start_when_their_inputs_exist_and_leases_move_to_the_receiver(h):
    rid = infer_diamond(h)
    assert running(h) == ["split"]
    split = step(h, "split")
    assert (split.id, split.params, split.timeout_us) == ("req-1", {"k": "v"}, 500)
    assert [d.name for d in split.inputs] == ["IN"] and sorted(o.name for o in split.outputs) == ["A", "B"]
    answer(h, "split", A=11, B=b"bbbb", lease=11)
    assert running(h) == ["left", "right"]                          # in parallel
    (a,) = step(h, "left").inputs
    assert (a.name, a.loc) == ("A", S.Block("/s", 11, 4))           # the runner keeps the lease
    answer(h, "right", R=b"rrrr")
    assert running(h) == ["left"]                                   # join waits for L
    answer(h, "left", L=21, LT=b"tttt", lease=21)
    join = step(h, "join")
    assert {d.name: d.loc for d in join.inputs} == {"L": S.Block("/s", 21, 4), "R": S.Inline(b"rrrr")}
    assert rid not in h.replies()
    answer(h, "join", SUM=31, lease=31)
    reply = h.replies()[rid]
    assert reply.error is None and reply.owner == ident(h, "join")
    assert [(d.name, S.lease_of(d)) for d in reply.outputs] == [("SUM", 31), ("LT", 0)]
    assert h.released() == sorted([(ident(h, "split"), 11), (ident(h, "left"), 21)])   # SUM's went on
    (mv,) = h.broker.registry.get("diamond").values()
    assert (mv.stats.execution_count, mv.stats.success.count, mv.stats.inference_count) == (1, 1, 1)


def test_only_steps_for_the_requested_outputs_run(h):
    rid = infer_diamond(h, "LT")
    answer(h, "split", A=11, lease=11)
    assert running(h) == ["left"]
    assert [o.name for o in step(h, "left").outputs] == ["LT"]
    answer(h, "left", LT=22, lease=22)
    reply = h.replies()[rid]
    assert [d.name for d in reply.outputs] == ["LT"] and reply.owner == ident(h, "left")
    assert h.released() == [(ident(h, "split"), 11)]


def test_a_failing_step_waits_for_executing_siblings_then_releases_everything(h):
    rid = infer_diamond(h)
    answer(h, "split", A=11, B=12, lease=11)
    answer(h, "right", error="right broke")
    assert rid not in h.replies()                                   # left still executes
    answer(h, "left", L=21, LT=22, lease=21)
    reply = h.replies()[rid]
    assert reply.error.message == "in ensemble 'diamond', step 2 (model 'right') failed: right broke"
    assert reply.error.code is Code.INTERNAL and not reply.outputs
    assert h.released() == sorted([(ident(h, "split"), 11), (ident(h, "left"), 21)])
    assert running(h) == []
    (mv,) = h.broker.registry.get("diamond").values()
    # Triton counts the failed composing request against the ensemble as well as the ensemble
    # request itself, both as reason OTHER (L0_model_queue's test_policy_reject: 4 for 2)
    assert mv.stats.fail.count == 2 and mv.stats.failures["OTHER"] == 2 and mv.stats.execution_count == 0


def test_a_failing_step_takes_queued_siblings_out_of_their_queues(h):
    busy = h.infer("right", B=IN)                                   # right's only instance is busy
    rid = infer_diamond(h)
    answer(h, "split", A=11, B=12, lease=11)
    answer(h, "left", error="left broke")
    assert "step 1 (model 'left') failed: left broke" in h.replies()[rid].error.message
    answer(h, "right", R=b"rrrr")                                   # the other request's batch
    assert h.replies()[busy].error is None and running(h) == []     # the queued step never ran
    assert h.released() == [(ident(h, "split"), 11)]


def test_an_ensemble_is_unavailable_while_a_composing_model_is(h):
    (split,) = h.instances("split")
    while split.state is not InstanceState.FAILED:                  # split crash-loops
        h.die(split, 3)
        h.tick(10.0)
    (mv,) = h.broker.registry.get("diamond").values()
    assert mv.state is S.ModelState.UNAVAILABLE and "step 0 (model 'split')" in mv.reason
    rid = infer_diamond(h)
    assert h.replies()[rid].error.message == "Request for unknown model: 'diamond' has no available versions"


def test_a_step_refused_at_once_ends_the_request(tmp_path):
    for name, (ins, outs) in COMPOSING.items():
        python_model(tmp_path, name, ins, outs, max_batch_size=4,
                     extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    ensemble_model(tmp_path, "diamond", DIAMOND.replace("max_batch_size: 0", "max_batch_size: 4"))
    h = Harness(tmp_path).load("*")
    h.infer("split", IN=np.zeros((1, 1), np.float32))               # executing
    h.infer("split", IN=np.zeros((1, 1), np.float32))               # queued: the queue is full
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "diamond", -1, [S.TensorDesc("IN", "FP32", [1, 1], S.Inline(IN.tobytes()))],
                            id="req-1"))
    err = h.replies()[rid].error
    assert err.code is Code.UNAVAILABLE
    assert err.message == ("in ensemble 'diamond', step 0 (model 'split') failed: "
                           "[request id: req-1] Exceeds maximum queue size")


def test_outputs_from_several_workers_travel_under_one_releasable_identity(h):
    rid = infer_diamond(h)
    answer(h, "split", A=11, B=12, lease=11)
    answer(h, "right", R=b"rrrr")
    answer(h, "left", L=21, LT=22, lease=21)
    answer(h, "join", SUM=31, lease=31)
    reply = h.replies()[rid]
    assert reply.owner.startswith(b"ensemble:")
    assert sorted(S.lease_of(d) for d in reply.outputs) == [1, 2]
    assert h.released() == [(ident(h, "split"), 11)]
    h.from_frontend(S.Release(reply.owner, [1, 2]))
    assert h.released() == sorted([(ident(h, "split"), 11), (ident(h, "left"), 21), (ident(h, "join"), 31)])
    assert not h.broker.ensembles.handovers


def test_a_nested_ensemble_hands_its_leases_to_the_enclosing_one(h):
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "outer", -1, [S.TensorDesc("IN", "FP32", [1], S.Inline(b"xxxx"))]))
    answer(h, "split", A=11, B=12, lease=11)
    answer(h, "right", R=b"rrrr")
    answer(h, "left", L=21, LT=22, lease=21)
    answer(h, "join", SUM=31, lease=31)
    (s,) = step(h, "right").inputs
    assert (s.name, s.loc) == ("B", S.Block("/s", 31, 4))
    assert h.released() == []              # the inner ensemble handed its leases to the outer one
    answer(h, "right", R=41, lease=41)
    reply = h.replies()[rid]
    assert reply.owner == ident(h, "right") and [S.lease_of(d) for d in reply.outputs] == [41]
    assert h.released() == sorted([(ident(h, "split"), 11), (ident(h, "left"), 21), (ident(h, "join"), 31)])


def test_readiness_follows_the_composing_models(h):
    (mv,) = h.broker.registry.get("diamond").values()
    assert (mv.state, mv.reason) == (S.ModelState.READY, "")
    (left,) = h.instances("left")
    h.die(left, -9)
    assert mv.state is S.ModelState.UNAVAILABLE
    assert mv.reason.startswith("in ensemble 'diamond', step 1 (model 'left'): composing model 'left' is not "
                                "available: model 'left' has no live instance (restarting)")
    h.tick(1.0)
    h.up("left")
    assert mv.state is S.ModelState.READY


def test_readiness_rechecks_completed_configs(tmp_path):
    for name, (ins, outs) in COMPOSING.items():
        python_model(tmp_path, name, ins, outs)
    ensemble_model(tmp_path, "diamond", DIAMOND)
    h = Harness(tmp_path).load("split", "left", "right")
    (join,) = h.broker.registry.get("join").values()
    late = dict(join.config, output=[{"name": "SUM", "data_type": "TYPE_INT32", "dims": ["-1"]}])
    h.up("join", config=late)                 # the worker auto-completed a different type
    (mv,) = h.broker.registry.get("diamond").values()
    assert mv.state is S.ModelState.UNAVAILABLE and "inconsistent data type" in mv.reason
    assert "ensemble tensor SUM:" in mv.reason


def test_load_order_puts_ensembles_after_what_they_compose(tmp_path, h):
    from tritond.repository.layout import scan
    repo = tmp_path / "order"
    repo.mkdir()
    for name in ("alpha", "zeta"):
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(f'name: "{name}" backend: "python"')
    (repo / "outer").mkdir()
    (repo / "outer" / "config.pbtxt").write_text(
        'name: "outer" platform: "ensemble" ensemble_scheduling { step [ { model_name: "inner" }, '
        '{ model_name: "zeta" } ] }')
    (repo / "inner").mkdir()
    (repo / "inner" / "config.pbtxt").write_text(
        'name: "inner" platform: "ensemble" ensemble_scheduling { step [ { model_name: "alpha" } ] }')
    sources = scan([str(repo)])
    ens = h.broker.ensembles
    assert ens.load_order(sources, sorted(sources)) == ["alpha", "zeta", "inner", "outer"]
    assert ens.load_order(sources, ["outer"]) == ["alpha", "zeta", "inner", "outer"]
    assert ens.load_order(sources, ["zeta"]) == ["zeta"]


# ---------------------------------------------------------------------- BLS

def test_a_call_is_refused_only_when_it_could_never_be_answered(h):
    bls = h.broker.bls
    (split,) = h.broker.registry.get("split").values()
    (left,) = h.broker.registry.get("left").values()
    (a,) = split.instances
    (l0,) = left.instances
    assert bls.would_deadlock(a, split)                       # its only instance is the caller
    assert not bls.would_deadlock(a, left)
    bls.waits = {l0.identity: [split]}
    assert bls.would_deadlock(a, left)                        # left waits on split, which waits on left
    l0.move_to(InstanceState.RESTARTING)
    bls.waits = {}
    assert not bls.would_deadlock(a, left)


def test_bls_calls_are_answered_to_the_caller_and_refused_when_they_would_deadlock(h):
    ((caller, _),) = [(i, None) for i in h.instances("split")]
    h.from_worker(caller, S.Infer(5, "left", -1, [S.TensorDesc("A", "FP32", [1], S.Inline(b"aaaa"))]))
    assert set(h.broker.bls.waits) == {caller.identity}
    answer(h, "left", L=b"llll", LT=b"tttt")
    ((to, reply),) = [(i, m) for i, m in h.sockets.worker if isinstance(m, S.InferReply)]
    assert to == caller.identity and reply.rid == 5 and reply.error is None
    assert not h.broker.bls.waits
    h.from_worker(caller, S.Infer(6, "split", -1, [S.TensorDesc("IN", "FP32", [1], S.Inline(b"iiii"))]))
    refused = [m for i, m in h.sockets.worker if isinstance(m, S.InferReply) and m.rid == 6]
    assert "would deadlock" in refused[0].error.message


REPEAT_SQUARE = """
name: "repeat_square" platform: "ensemble"
input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "r" } },
  { model_name: "square" model_version: -1 input_map { key: "IN" value: "r" } output_map { key: "OUT" value: "OUT" } }
] }"""


def fp32(v: float) -> S.Inline:
    return S.Inline(np.float32(v).tobytes())


def streaming_repo(tmp_path) -> Harness:
    python_model(tmp_path, "repeat", ["IN"], ["OUT"], extra="model_transaction_policy { decoupled: true }")
    python_model(tmp_path, "square", ["IN"], ["OUT"])
    ensemble_model(tmp_path, "repeat_square", REPEAT_SQUARE)
    return Harness(tmp_path).load("*")


def respond(h: Harness, *values: float, final: bool = False, lease: int = 0) -> None:
    """The decoupled `repeat` sends one response per value (in a block under `lease` when given)."""
    (inst,) = h.instances("repeat")
    key = [m for i, m in h.to_workers(S.Exec) if i == inst.identity][-1].requests[0].key
    for v in values:
        loc = S.Block("/s", int(v), 4, lease) if lease else fp32(v)
        h.from_stream(inst, S.Respond(key, [S.TensorDesc("OUT", "FP32", [1], loc)]))
    if final:
        h.from_stream(inst, S.Respond(key, final=True, empty=True))


def test_each_response_of_a_decoupled_step_runs_the_steps_it_feeds(tmp_path):
    """L0_decoupled's repeat_square: every response of the decoupled step runs the step it feeds
    with that response, and each result is one more response of the ensemble; the last response
    only ends the request."""
    h = streaming_repo(tmp_path)
    (mv,) = h.broker.registry.get("repeat_square").values()
    assert mv.state is S.ModelState.READY
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "repeat_square", -1, [S.TensorDesc("IN", "FP32", [1], fp32(7))]))
    ((rep, ex),) = h.executing("repeat")
    h.from_worker(rep, S.BatchDone(ex.bid, []))
    respond(h, 2.0, 3.0)
    ((sq, first),) = h.executing("square")
    assert first.requests[0].inputs[0].loc == fp32(2.0)
    h.answer(sq, first, {"OUT": fp32(4.0)})
    ((sq, second),) = h.executing("square")
    assert second.requests[0].inputs[0].loc == fp32(3.0)
    h.answer(sq, second, {"OUT": fp32(9.0)})
    got = [m for m in h.frontend_replies() if m.rid == rid]
    assert [(m.more, [(d.name, d.loc) for d in m.outputs]) for m in got] == [
        (True, [("OUT", fp32(4.0))]), (True, [("OUT", fp32(9.0))])]
    respond(h, final=True)
    last = [m for m in h.frontend_replies() if m.rid == rid][-1]
    assert not last.more and last.error is None and last.empty
    assert mv.stats.inference_count == 1 and sum(mv.stats.failures.values()) == 0


def test_the_last_branchs_result_carries_the_final_flag(tmp_path):
    """L0_simple_ensemble's max_queue_size flows: the decoupled step has ended when its one branch
    answers, so that answer is the request's last response, as Triton sends it (a client that did
    not ask for empty final responses would otherwise never see the end)."""
    h = streaming_repo(tmp_path)
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "repeat_square", -1, [S.TensorDesc("IN", "FP32", [1], fp32(7))]))
    ((rep, ex),) = h.executing("repeat")
    h.from_worker(rep, S.BatchDone(ex.bid, []))
    respond(h, 2.0, final=True)
    assert [m for m in h.frontend_replies() if m.rid == rid] == []
    h.answer(*h.executing("square")[0], {"OUT": fp32(4.0)})
    (last,) = [m for m in h.frontend_replies() if m.rid == rid]
    assert not last.more and last.error is None and [(d.name, d.loc) for d in last.outputs] == [("OUT", fp32(4.0))]
    (mv,) = h.broker.registry.get("repeat_square").values()
    assert mv.stats.inference_count == 1


def test_a_branch_holds_its_response_until_its_result_leaves_and_a_failure_ends_the_request(tmp_path):
    h = streaming_repo(tmp_path)
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "repeat_square", -1, [S.TensorDesc("IN", "FP32", [1], fp32(1))], [S.OutputSpec("OUT")]))
    ((rep, ex),) = h.executing("repeat")
    h.from_worker(rep, S.BatchDone(ex.bid, []))
    respond(h, 16.0, lease=5)
    assert h.released() == []                  # the branch reads the response's block
    ((sq, batch),) = h.executing("square")
    h.answer(sq, batch, S.ExecResult(error=S.TritonError(Code.INTERNAL, "boom")))
    assert (rep.identity, 5) in h.released()   # the branch ended: its response's lease goes back
    respond(h, final=True)
    (last,) = [m for m in h.frontend_replies() if m.rid == rid]
    assert last.error.message == "in ensemble 'repeat_square', step 1 (model 'square') failed: boom"
    assert sum(h.broker.registry.get("repeat_square")[1].stats.failures.values()) >= 1


def test_a_step_on_a_version_not_loaded_is_refused_in_tritons_words(tmp_path):
    """L0_model_config's no_required_version: the step asks for version 2, only 1 is loaded."""
    for name, (ins, outs) in COMPOSING.items():
        python_model(tmp_path, name, ins, outs)
    ensemble_model(tmp_path, "diamond", DIAMOND.replace('model_name: "right" model_version: -1',
                                                        'model_name: "right" model_version: 2'))
    h = Harness(tmp_path).load("*")
    (mv,) = h.broker.registry.get("diamond").values()
    assert mv.state is S.ModelState.UNAVAILABLE
    assert mv.reason == "ensemble 'diamond' depends on 'right' whose required version 2 is not loaded."


def test_ensembles_composing_each_other_are_refused_in_tritons_words(tmp_path):
    """L0_model_config's circular_dependency and self_circular_dependency."""
    python_model(tmp_path, "right", ["B"], ["R"])
    loop = """
name: "{name}" platform: "ensemble"
input [{{ name: "B" data_type: TYPE_FP32 dims: [-1] }}]
output [{{ name: "R" data_type: TYPE_FP32 dims: [-1] }}]
ensemble_scheduling {{ step [
  {{ model_name: "{other}" model_version: -1 input_map {{ key: "B" value: "B" }} output_map {{ key: "R" value: "R" }} }}
] }}
"""
    ensemble_model(tmp_path, "a", loop.format(name="a", other="b"))
    ensemble_model(tmp_path, "b", loop.format(name="b", other="a"))
    ensemble_model(tmp_path, "self", loop.format(name="self", other="self"))
    h = Harness(tmp_path).load("*")
    reasons = {name: mv.reason for name in ("a", "b", "self") for mv in h.broker.registry.get(name).values()}
    assert reasons["self"] == "circular dependency between ensembles: self -> ... -> self -> self"
    assert any(r.startswith("circular dependency between ensembles: ") for r in (reasons["a"], reasons["b"]))
