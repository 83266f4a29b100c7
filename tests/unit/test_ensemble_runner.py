"""The broker's ensemble runner against a stand-in broker: which steps start when, which
descriptors each step gets, and that every lease on an intermediate is released exactly once
on every path (success, failing step, cancelled sibling, outputs from several workers)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.broker import protocol as P
from tritond.broker.ensemble import Ensembles, EnsembleVersion, Plan
from tritond.broker.models import READY, UNAVAILABLE, ModelVersion
from tritond.broker.pool import Instance
from tritond.repository.catalog import ModelSpec
from tritond.repository.render import config_to_json

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

COMPOSING = {
    "split": (["IN"], ["A", "B"]),
    "left": (["A"], ["L", "LT"]),
    "right": (["B"], ["R"]),
    "join": (["L", "R"], ["SUM"]),
}


def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def composing_config(name: str) -> model_config_pb2.ModelConfig:
    ins, outs = COMPOSING[name]
    tensors = [f'input {{ name: "{i}" data_type: TYPE_FP32 dims: [-1] }}' for i in ins]
    tensors += [f'output {{ name: "{o}" data_type: TYPE_FP32 dims: [-1] }}' for o in outs]
    return config(f'name: "{name}" backend: "python" ' + " ".join(tensors))


class Scheduler:
    def remove(self, pred):
        return []


@dataclass
class Req:
    src: object
    msg: P.Infer
    mv: ModelVersion
    dispatch_ns: int = 0
    regions: list = field(default_factory=list)

    @property
    def pending(self):
        return self


class QueueOf(Scheduler):
    def __init__(self, broker: "Broker") -> None:
        self.b = broker

    def remove(self, pred):
        taken = [r for r in self.b.admitted if not r.dispatch_ns and pred(r)]
        for r in taken:
            self.b.admitted.remove(r)
            self.b.cancelled.append(r.msg.model)
        return taken


class Control:
    def resolve_regions(self, msg):
        return [], None

    def release_regions(self, regions):
        pass


class Broker:
    """What the runner uses of the broker, recording what it is asked to do."""

    def __init__(self) -> None:
        self.opts: dict = {}
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.specs: dict[str, ModelSpec] = {}
        self.control = Control()
        self.table_dirty = False
        self.admitted: list[Req] = []
        self.cancelled: list[str] = []
        self.released: list[tuple[bytes, list[int]]] = []
        self.replies: list[P.InferReply] = []
        self.by_identity: dict = {}
        self.inst_model: dict = {}
        for name in COMPOSING:
            cfg = composing_config(name)
            self.specs[name] = ModelSpec(name, f"/r/{name}", cfg, [1])
            mv = ModelVersion(name, 1, f"/r/{name}", "/r", config_to_json(cfg), state=READY)
            mv.scheduler = QueueOf(self)
            self.models[name] = {1: mv}

    def resolve(self, name, version):
        mv = self.models.get(name, {}).get(1)
        if mv is None or mv.state != READY:
            return None, P.Err("UNAVAILABLE", f"'{name}' is not ready")
        return mv, None

    def admit(self, src, msg, mv):
        req = Req(src, msg, mv)
        self.admitted.append(req)
        return req

    def send_reply(self, src, reply):
        if callable(src):
            src(reply)
        else:
            self.replies.append(reply)

    def reject(self, src, msg, err):
        self.send_reply(src, P.InferReply(msg.rid, error=err))

    def route_release(self, msg):
        self.released.append((msg.owner, sorted(msg.leases)))

    # ---------------------------------------------------------------- test helpers

    def step(self, model: str) -> Req:
        (req,) = [r for r in self.admitted if r.msg.model == model]
        return req

    def answer(self, model: str, owner: bytes = b"", error: str = "", lease: int = 0, **outputs) -> None:
        """Reply to the queued step of `model`. An output given as an int is the offset of a large
        one; as a worker does, all large outputs of one reply share the reply's `lease`."""
        req = self.step(model)
        self.admitted.remove(req)
        descs = [P.TensorDesc(n, "FP32", [1], seg="s", offset=v, nbytes=4, lease=lease) if isinstance(v, int)
                 else P.TensorDesc(n, "FP32", [1], data=v) for n, v in outputs.items()]
        err = P.Err("INTERNAL", error) if error else None
        req.src(P.InferReply(req.msg.rid, 1, [] if err else descs, err, owner))

    def released_units(self) -> list[tuple[bytes, int]]:
        return sorted((o, lease) for o, leases in self.released for lease in leases)


@pytest.fixture
def broker():
    return Broker()


@pytest.fixture
def ens(broker):
    return Ensembles(broker)


def ensemble_version(broker, ens, text=DIAMOND) -> EnsembleVersion:
    cfg = config(text)
    spec = ModelSpec(cfg.name, f"/r/{cfg.name}", cfg, [1])
    broker.specs[cfg.name] = spec
    mv = ens.setup(spec, 1, config_to_json(cfg))
    broker.models[cfg.name] = {1: mv}
    return mv


def request(*wanted: str, rid: int = 7) -> P.Infer:
    return P.Infer(rid, "diamond", -1, [P.TensorDesc("IN", "FP32", [1], data=b"\0\0\0\0")],
                   [P.OutputSpec(n) for n in wanted], "req-1", {"k": "v"}, 3, 500, 0, 0)


def run_diamond(broker, ens, *wanted):
    mv = ensemble_version(broker, ens)
    assert mv.state == READY
    ens.run("client", request(*wanted), mv)
    return mv


def test_plan_knows_producers_consumers_and_needed_steps():
    plan = Plan(config_to_json(config(DIAMOND)))
    assert plan.producer == {"a": 0, "b": 0, "l": 1, "LT": 1, "r": 2, "SUM": 3}
    assert plan.consumers == {"IN": [0], "a": [1], "b": [2], "l": [3], "r": [3]}
    assert plan.needed(("LT",)) == ((True, True, False, False), {"LT", "a", "IN"})
    assert plan.needed(("SUM",))[0] == (True, True, True, True)


def test_steps_start_when_their_inputs_exist_and_leases_move_to_the_receiver(broker, ens):
    mv = run_diamond(broker, ens)
    assert [r.msg.model for r in broker.admitted] == ["split"]
    split = broker.step("split").msg
    assert (split.id, split.params, split.priority, split.timeout_us) == ("req-1", {"k": "v"}, 3, 500)
    assert [d.name for d in split.inputs] == ["IN"] and sorted(o.name for o in split.outputs) == ["A", "B"]
    broker.answer("split", b"w1", A=11, B=b"bbbb", lease=11)
    assert sorted(r.msg.model for r in broker.admitted) == ["left", "right"]      # in parallel
    a = broker.step("left").msg.inputs[0]
    assert (a.name, a.seg, a.offset, a.lease) == ("A", "s", 11, 0)
    broker.answer("right", b"w3", R=b"rrrr")
    assert [r.msg.model for r in broker.admitted] == ["left"]                       # join waits for L
    broker.answer("left", b"w2", L=21, LT=b"tttt", lease=21)
    join = broker.step("join").msg
    assert {d.name: (d.data, d.offset) for d in join.inputs} == {"L": (None, 21), "R": (b"rrrr", 0)}
    assert not broker.replies
    broker.answer("join", b"w4", SUM=31, lease=31)
    (reply,) = broker.replies
    assert reply.error is None and reply.rid == 7 and reply.owner == b"w4"
    assert [(d.name, d.lease) for d in reply.outputs] == [("SUM", 31), ("LT", 0)]
    assert broker.released_units() == [(b"w1", 11), (b"w2", 21)]     # SUM's lease went to the receiver
    stats = mv.stats
    assert (stats.execution_count, stats.success.count, stats.inference_count) == (1, 1, 1)


def test_only_steps_for_the_requested_outputs_run(broker, ens):
    run_diamond(broker, ens, "LT")
    broker.answer("split", b"w1", A=11, lease=11)
    assert [r.msg.model for r in broker.admitted] == ["left"]
    assert [o.name for o in broker.step("left").msg.outputs] == ["LT"]
    broker.answer("left", b"w2", LT=22, lease=22)
    (reply,) = broker.replies
    assert [d.name for d in reply.outputs] == ["LT"] and reply.owner == b"w2"
    assert broker.released_units() == [(b"w1", 11)]


def test_a_failing_step_waits_for_executing_siblings_then_releases_everything(broker, ens):
    mv = run_diamond(broker, ens)
    broker.answer("split", b"w1", A=11, B=12, lease=11)
    broker.step("left").dispatch_ns = 1           # executing: cannot be taken back
    broker.answer("right", b"w3", error="right broke")
    assert not broker.replies
    broker.answer("left", b"w2", L=21, LT=22, lease=21)
    (reply,) = broker.replies
    assert reply.error.message == "in ensemble 'diamond', step 2 (model 'right') failed: right broke"
    assert reply.error.code == "INTERNAL" and not reply.outputs
    assert broker.released_units() == [(b"w1", 11), (b"w2", 21)]
    assert not broker.admitted and mv.stats.fail.count == 1 and mv.stats.execution_count == 0


def test_a_failing_step_takes_queued_siblings_out_of_their_queues(broker, ens):
    run_diamond(broker, ens)
    broker.answer("split", b"w1", A=11, B=12, lease=11)
    broker.answer("left", b"w2", error="left broke")
    assert broker.cancelled == ["right"] and not broker.admitted
    (reply,) = broker.replies
    assert "step 1 (model 'left') failed: left broke" in reply.error.message
    assert broker.released_units() == [(b"w1", 11)]


def test_a_step_refused_at_once_ends_the_request(broker, ens):
    broker.models["split"][1].state = UNAVAILABLE
    mv = ensemble_version(broker, ens)
    assert mv.state == UNAVAILABLE and "step 0 (model 'split')" in mv.reason
    ens.run("client", request(), mv)
    (reply,) = broker.replies
    assert reply.error.code == "UNAVAILABLE" and "step 0 (model 'split') failed" in reply.error.message


def test_outputs_from_several_workers_travel_under_one_releasable_identity(broker, ens):
    run_diamond(broker, ens)
    broker.answer("split", b"w1", A=11, B=12, lease=11)
    broker.answer("right", b"w3", R=b"rrrr")
    broker.answer("left", b"w2", L=21, LT=22, lease=21)
    broker.answer("join", b"w4", SUM=31, lease=31)
    (reply,) = broker.replies
    assert reply.owner.startswith(b"ensemble:")
    assert sorted(d.lease for d in reply.outputs) == [1, 2]
    assert broker.released_units() == [(b"w1", 11)]
    broker.released.clear()
    assert ens.release_handover(P.Release(reply.owner, [1, 2]))
    assert broker.released_units() == [(b"w2", 21), (b"w4", 31)]
    assert not ens.handovers and not ens.release_handover(P.Release(b"w2", [22]))


def test_a_nested_ensemble_hands_its_leases_to_the_enclosing_one(broker, ens):
    ensemble_version(broker, ens)
    outer = ensemble_version(broker, ens, """
        name: "outer" platform: "ensemble"
        input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
        output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
        ensemble_scheduling { step [
          { model_name: "diamond" model_version: -1 input_map { key: "IN" value: "IN" }
            output_map { key: "SUM" value: "s" } },
          { model_name: "right" model_version: -1 input_map { key: "B" value: "s" } output_map { key: "R" value: "OUT" } }
        ] }""")
    ens.run("client", P.Infer(9, "outer", -1, [P.TensorDesc("IN", "FP32", [1], data=b"xxxx")]), outer)
    broker.answer("split", b"w1", A=11, B=12, lease=11)
    broker.answer("right", b"w3", R=b"rrrr")
    broker.answer("left", b"w2", L=21, LT=22, lease=21)
    broker.answer("join", b"w4", SUM=31, lease=31)
    s = broker.step("right").msg.inputs[0]
    assert (s.name, s.offset) == ("B", 31) and not broker.released
    broker.answer("right", b"w3", R=41, lease=41)
    (reply,) = broker.replies
    assert reply.owner == b"w3" and [d.lease for d in reply.outputs] == [41]
    assert broker.released_units() == [(b"w1", 11), (b"w2", 21), (b"w4", 31)]


def test_readiness_follows_the_composing_models(broker, ens):
    mv = ensemble_version(broker, ens)
    assert (mv.state, mv.reason) == (READY, "")
    broker.models["left"][1].state = "LOADING"
    assert mv.state == "LOADING"
    broker.models["left"][1].state, broker.models["left"][1].reason = UNAVAILABLE, "unloaded"
    assert mv.state == UNAVAILABLE
    assert mv.reason == "in ensemble 'diamond', step 1 (model 'left'): composing model 'left' is not available: unloaded"
    broker.models["left"][1].state, broker.models["left"][1].reason = READY, ""
    mv.state, mv.reason = UNAVAILABLE, "unloaded"       # the ensemble itself unloaded
    assert (mv.state, mv.reason) == (UNAVAILABLE, "unloaded")


def test_readiness_rechecks_completed_configs(broker, ens):
    mv = ensemble_version(broker, ens)
    late = composing_config("join")
    late.output[0].data_type = model_config_pb2.TYPE_INT32
    broker.models["join"][1].config = config_to_json(late)
    assert mv.state == UNAVAILABLE and "inconsistent data type" in mv.reason and "tensor 'SUM'" in mv.reason


def test_load_order_puts_ensembles_after_what_they_compose(tmp_path, broker, ens):
    from tritond.repository.layout import scan
    for name in ("alpha", "zeta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}" backend: "python"')
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / "config.pbtxt").write_text(
        'name: "outer" platform: "ensemble" ensemble_scheduling { step [ { model_name: "inner" }, '
        '{ model_name: "zeta" } ] }')
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "config.pbtxt").write_text(
        'name: "inner" platform: "ensemble" ensemble_scheduling { step [ { model_name: "alpha" } ] }')
    sources = scan([str(tmp_path)])
    assert ens.load_order(sources, sorted(sources)) == ["alpha", "zeta", "inner", "outer"]
    assert ens.load_order(sources, ["outer"]) == ["alpha", "zeta", "inner", "outer"]
    assert ens.load_order(sources, ["zeta"]) == ["zeta"]


# ---------------------------------------------------------------------- BLS deadlock check

def instance(broker, model: str, index: int = 0, state: str = "BUSY") -> Instance:
    inst = Instance(model, 1, index, f"{model}_{index}", state=state)
    mv = broker.models[model][1]
    mv.instances.append(inst)
    broker.by_identity[inst.identity] = inst
    broker.inst_model[id(inst)] = mv
    return inst


def test_a_call_is_refused_only_when_it_could_never_be_answered(broker, ens):
    bls = ens.bls
    split, left = broker.models["split"][1], broker.models["left"][1]
    a = instance(broker, "split")
    assert bls.would_deadlock(a, split)                       # its only instance is the caller
    b = instance(broker, "split", 1, state="READY")
    assert not bls.would_deadlock(a, split)                   # another instance can serve it
    bls.waits[b.identity] = [split]
    assert bls.would_deadlock(a, split)                       # ... unless it waits on split too
    l0 = instance(broker, "left")
    bls.waits = {b.identity: [left]}
    assert not bls.would_deadlock(a, split)                   # b waits on left, which is free to finish
    bls.waits[l0.identity] = [split]
    assert bls.would_deadlock(a, split)                       # split -> left -> split, all waiting
    l0.state = "RESTARTING"
    bls.waits.pop(l0.identity)
    assert not bls.would_deadlock(a, split)


def test_bls_replies_return_to_the_caller_and_end_its_wait(broker, ens):
    caller = instance(broker, "split")
    instance(broker, "left")
    sent = []

    class Sock:
        def send_multipart(self, frames):
            sent.append(frames)

    route = ens.bls_call((Sock(), caller.identity), P.Infer(5, "left"), broker.models["left"][1])
    assert ens.bls.waits == {caller.identity: [broker.models["left"][1]]}
    route(P.InferReply(5))
    assert not ens.bls.waits and sent and sent[0][0] == caller.identity
    refused = ens.bls_call((Sock(), caller.identity), P.Infer(6, "split"), broker.models["split"][1])
    assert refused is None and "would deadlock" in broker.replies[-1].error.message

