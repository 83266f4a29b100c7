"""Sequences, decoupled responses and cancellation through the real broker, in-process with a
fake clock: the control inputs and padding a sequence batch carries, sequences lost with
their worker, idle sequences whose state the worker is told to free, responses forwarded as
they come with credits back to the worker, and cancelled queued and executing requests."""
from __future__ import annotations

import struct

import numpy as np
from broker_harness import Harness, python_model

from tritond.wire import schema as S
from tritond.wire.errors import Code

X = np.ones((1, 1), np.float32)
CONTROLS = ('control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },'
            ' { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }] },'
            ' { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }]')


def seq_request(h: Harness, corrid, flags: int, model: str = "seq", ident: bytes = b"fe") -> int:
    rid = next(h.rids)
    x = S.TensorDesc("X", "FP32", [1, 1], S.Inline(X.tobytes()))
    h.from_frontend(S.Infer(rid, model, -1, [x], [], "", {}, 0, 0, corrid, flags), ident)
    return rid


def control_values(req: S.ExecRequest) -> dict:
    fmt = {"START": "<i", "READY": "<f", "CORRID": "<Q"}
    return {d.name: struct.unpack(fmt[d.name], d.loc.data)[0] for d in req.inputs if d.name in fmt}


def sequence_repo(tmp_path, extra: str = "", max_batch_size: int = 2):
    python_model(tmp_path, "seq", ["X"], ["Y"], f"sequence_batching {{ {CONTROLS} {extra} }}", max_batch_size)
    return tmp_path


def test_a_direct_batch_carries_controls_and_pads_empty_slots(tmp_path):
    h = Harness(sequence_repo(tmp_path)).load("*")
    seq_request(h, 1, 1)                              # slot 0, runs alone at once
    ((inst, first),) = h.executing("seq")
    assert control_values(first.requests[0]) == {"START": 1, "READY": 1.0, "CORRID": 1}
    assert first.requests[0].seq and not first.requests[0].pad
    rid = seq_request(h, 2, 1)                        # slot 1: waits for the instance
    h.answer(inst, first, {"Y": S.Inline(X.tobytes())})
    ((_, second),) = h.executing("seq")
    pad, real = second.requests
    assert pad.pad and all(isinstance(d.loc, S.Zeros) for d in pad.inputs if d.name == "X")
    assert control_values(pad) == {"START": 0, "READY": 0.0, "CORRID": 0}
    assert control_values(real) == {"START": 1, "READY": 1.0, "CORRID": 2}
    assert [d.shape for d in real.inputs if d.name == "START"] == [[1, 1]]
    h.answer(inst, second, {"Y": S.Inline(X.tobytes())})       # one result: padding has none
    assert h.replies()[rid].error is None


def test_sequence_errors_are_triton_s(tmp_path):
    h = Harness(sequence_repo(tmp_path)).load("*")
    rid = seq_request(h, 5, 0)
    assert h.replies()[rid].error.message == ("inference request for sequence 5 to model 'seq' must specify the "
                                              "START flag on the first request of the sequence")
    rid = seq_request(h, 0, 1)
    assert h.replies()[rid].error.message == ("inference request to model 'seq' must specify a non-zero or "
                                              "non-empty correlation ID")
    rid = seq_request(h, "text", 1)
    assert h.replies()[rid].error.message == ("[request id: <id_unknown>] sequence batching control 'CORRID' "
                                              "data-type is 'BYTES', but model 'seq' expects 'UINT64'")
    rid = next(h.rids)
    x2 = S.TensorDesc("X", "FP32", [2, 1], S.Inline(np.ones((2, 1), np.float32).tobytes()))
    h.from_frontend(S.Infer(rid, "seq", -1, [x2], [], "", {}, 0, 0, 3, 1))
    assert h.replies()[rid].error.message == ("inference request to model 'seq' must specify batch-size 1 due to "
                                              "requirements of sequence batcher")


def test_a_dead_worker_loses_its_sequences_and_new_ones_run_on_its_successor(tmp_path):
    h = Harness(sequence_repo(tmp_path)).load("*")
    seq_request(h, 1, 1)
    ((inst, ex),) = h.executing("seq")
    queued = seq_request(h, 1, 0)
    h.die(inst, -9)
    replies = h.replies()
    assert replies[queued].error.code is Code.UNAVAILABLE
    assert "sequence 1 of model 'seq' was lost" in replies[queued].error.message
    h.tick(1.0)
    h.up("seq")
    later = seq_request(h, 1, 0)                      # still lost on the restarted worker
    assert h.replies()[later].error.message == replies[queued].error.message
    rid = seq_request(h, 2, 1)
    ((inst, ex),) = h.executing("seq")
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    assert h.replies()[rid].error is None


def test_an_idle_sequence_is_forgotten_and_its_worker_frees_the_state(tmp_path):
    h = Harness(sequence_repo(tmp_path, "max_sequence_idle_microseconds: 100000")).load("*")
    seq_request(h, 1, 1)
    ((inst, ex),) = h.executing("seq")
    key = ex.requests[0].seq
    h.answer(inst, ex, {"Y": S.Inline(X.tobytes())})
    h.tick(0.05)
    assert not h.to_workers(S.EndSequences)
    h.tick(0.1)
    assert [m.seqs for _, m in h.to_workers(S.EndSequences)] == [[key]]
    rid = seq_request(h, 1, 0)
    assert "must specify the START flag" in h.replies()[rid].error.message


def decoupled_repo(tmp_path):
    python_model(tmp_path, "dec", ["X"], ["Y"], "model_transaction_policy { decoupled: true }")
    return tmp_path


def test_decoupled_responses_stream_through_with_credits(tmp_path):
    h = Harness(decoupled_repo(tmp_path)).load("*")
    rid = next(h.rids)
    h.from_frontend(S.Infer(rid, "dec", -1, [S.TensorDesc("X", "FP32", [1], S.Inline(b"\0" * 4))], window=4))
    ((inst, ex),) = h.executing("dec")
    key = ex.requests[0].key
    assert ex.requests[0].window == 4
    h.from_worker(inst, S.BatchDone(ex.bid, []))       # execute returned: the instance is free
    h.from_stream(inst, *[S.Respond(key, [S.TensorDesc("Y", "FP32", [1], S.Inline(struct.pack("<f", i)))])
                          for i in range(3)])
    got = [m for m in h.frontend_replies() if m.rid == rid]
    assert [m.more for m in got] == [True] * 3 and got[0].owner == inst.identity
    assert isinstance(h.sockets.frontend[-1][1], S.Replies)       # one frame for the three
    h.from_frontend(S.Credit(rid, 2))
    assert [(i, m.key, m.n) for i, m in h.to_workers(S.Grant)] == [(S.heartbeat_identity(inst.identity), key, 2)]
    h.from_stream(inst, S.Respond(key, final=True, empty=True))
    last = [m for m in h.frontend_replies() if m.rid == rid][-1]
    assert not last.more and last.empty and last.error is None
    assert h.instances("dec")[0].batch is None


def test_a_worker_death_ends_its_open_streams(tmp_path):
    h = Harness(decoupled_repo(tmp_path)).load("*")
    rid = h.infer("dec", X=np.zeros(1, np.float32))
    ((inst, ex),) = h.executing("dec")
    h.from_worker(inst, S.BatchDone(ex.bid, []))
    h.die(inst, -9)
    assert h.replies()[rid].error.code is Code.UNAVAILABLE and not h.replies()[rid].more


def test_cancel_takes_a_queued_request_out_and_flags_an_executing_one(tmp_path):
    python_model(tmp_path, "m", ["X"], ["Y"])
    h = Harness(tmp_path).load("*")
    running = h.infer("m", X=np.zeros(1, np.float32))
    queued = h.infer("m", X=np.zeros(1, np.float32))
    h.from_frontend(S.Cancel(queued))
    assert h.replies()[queued].error.code is Code.CANCELLED
    (mv,) = h.broker.registry.get("m").values()
    assert mv.stats.failures["CANCELED"] == 1        # nv_inference_request_failure{reason="CANCELED"}
    ((inst, ex),) = h.executing("m")
    h.from_frontend(S.Cancel(running))
    assert [(i, m.keys) for i, m in h.to_workers(S.CancelKeys)] == [
        (S.heartbeat_identity(inst.identity), [ex.requests[0].key])]
    h.answer(inst, ex, {"Y": S.Inline(b"\0" * 4)})
    assert h.replies()[running].error is None        # the model answered anyway
    h.from_frontend(S.Cancel(running))               # answered: nothing left to cancel
    assert len(h.to_workers(S.CancelKeys)) == 1 and len(h.broker.live) == 0


def test_cancelling_a_queued_request_of_a_sequence_counts_each_request_it_ends_as_canceled(tmp_path):
    """L0_request_cancellation's sequence cases: the sequence's queued requests all end, each a
    CANCELED failure in the statistics and metrics."""
    h = Harness(sequence_repo(tmp_path, max_batch_size=1)).load("*")
    seq_request(h, 1, 1)                              # runs in the one slot
    first, second = seq_request(h, 1, 0), seq_request(h, 1, 0)
    h.from_frontend(S.Cancel(first))
    assert [h.replies()[r].error.code for r in (first, second)] == [Code.CANCELLED] * 2
    (mv,) = h.broker.registry.get("seq").values()
    assert (mv.stats.failures["CANCELED"], mv.stats.failures["OTHER"]) == (2, 0)
