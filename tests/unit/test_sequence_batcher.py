"""The sequence batcher's bookkeeping with a fake clock: slots, padding, backlog, idle reaping,
backlog timeouts, lost instances, and the oldest strategy's one-request-per-sequence rule."""
from __future__ import annotations

import pytest

from tritond.broker.scheduling.batcher import Pending
from tritond.broker.scheduling.sequence_slots import FLAG_END, FLAG_START, SequenceBatcher, lost_message
from tritond.wire.errors import Code, TritonError
from tritond.wire.schema import SequenceBatching

MS = 1_000_000


def batcher(max_batch_size: int = 2, instances=("a", "b"), **kw) -> SequenceBatcher:
    return SequenceBatcher(SequenceBatching(**kw), max_batch_size, list(instances), "m")


def req(b: SequenceBatcher, corrid, flags=0, now=0, timeout_us=0) -> Pending:
    p = Pending(corrid, now, 1, ())
    b.enqueue(p, corrid, flags, timeout_us, now)
    return p


def names(entries) -> list:
    return [None if p is None else p.key for p in entries]


def test_new_sequences_take_the_lowest_free_slot_spreading_over_instances():
    b = batcher()
    for corrid in (1, 2, 3, 4):
        req(b, corrid, FLAG_START)
    slots = {corrid: (s.slot.instance, s.slot.index) for corrid, s in b.active.items()}
    assert slots == {1: ("a", 0), 2: ("b", 0), 3: ("a", 1), 4: ("b", 1)}
    assert names(b.next_batch("a", 0)[0]) == [1, 3]
    assert names(b.next_batch("b", 0)[0]) == [2, 4]
    assert len(b) == 0


def test_a_direct_batch_pads_slots_below_the_highest_ready_one():
    b = batcher(max_batch_size=3, instances=("a",))
    for corrid in (1, 2, 3):
        req(b, corrid, FLAG_START)
    b.next_batch("a", 0)
    req(b, 3)                       # only slot 2 has a request: slots 0 and 1 are padding
    assert names(b.next_batch("a", 0)[0]) == [None, None, 3]
    req(b, 1)                       # only slot 0: nothing behind it
    assert names(b.next_batch("a", 0)[0]) == [1]
    assert b.next_batch("a", 0) == ([], 0)


def test_requests_of_a_sequence_run_in_order_one_per_batch():
    b = batcher(max_batch_size=2, instances=("a",))
    first, second, third = req(b, 9, FLAG_START), req(b, 9), req(b, 9, FLAG_END)
    assert [names(b.next_batch("a", 0)[0]) for _ in range(3)] == [[9], [9], [9]]
    assert b.owner[first] is b.owner[second] is b.owner[third]
    assert 9 not in b.active and b.next_batch("a", 0) == ([], 0)


def test_sequences_beyond_the_slots_wait_in_the_backlog_first_come_first_served():
    b = batcher(max_batch_size=1, instances=("a",))
    req(b, 1, FLAG_START)
    req(b, 2, FLAG_START)
    req(b, 3, FLAG_START)
    req(b, 2, FLAG_END)
    assert [s.corrid for s in b.backlog] == [2, 3]
    assert names(b.next_batch("a", 0)[0]) == [1]
    req(b, 1, FLAG_END)
    assert names(b.next_batch("a", 0)[0]) == [1]         # its END frees the slot for sequence 2
    assert names(b.next_batch("a", 0)[0]) == [2]
    assert names(b.next_batch("a", 0)[0]) == [2]
    assert names(b.next_batch("a", 0)[0]) == [3]


def test_triton_errors_for_a_request_without_start():
    b = batcher()
    with pytest.raises(TritonError) as info:
        req(b, 5)
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == ("inference request for sequence 5 to model 'm' must specify the START flag on "
                                  "the first request of the sequence")
    req(b, "s", FLAG_START | FLAG_END)
    with pytest.raises(TritonError, match="sequence s to model"):
        req(b, "s")                 # ended


def test_a_start_for_an_active_id_continues_in_its_slot():
    b = batcher(max_batch_size=1, instances=("a",))
    req(b, 1, FLAG_START)
    seq = b.active[1]
    req(b, 1, FLAG_START)
    assert b.active[1] is seq and len(seq.queue) == 2


def test_idle_sequences_are_forgotten_and_free_their_slot():
    b = batcher(max_batch_size=1, instances=("a",), max_idle_us=1000)
    req(b, 1, FLAG_START, now=0)
    req(b, 2, FLAG_START, now=0)        # backlog
    p = b.next_batch("a", 0)[0][0]
    assert b.reap(5 * MS) == ([], 6 * MS)          # its request still executes: look again later
    b.done(p, 0)
    reaped, _ = b.reap(6 * MS)
    assert [s.corrid for s in reaped] == [1] and 1 not in b.active
    assert b.active[2].slot is not None          # the backlog sequence took the slot
    with pytest.raises(TritonError, match="must specify the START flag"):
        req(b, 1, now=6 * MS)


def test_a_sequence_with_a_request_in_flight_is_not_idle():
    b = batcher(max_batch_size=1, instances=("a",), max_idle_us=1000)
    req(b, 1, FLAG_START, now=0)
    b.next_batch("a", 0)
    reaped, wake = b.reap(10 * MS)
    assert reaped == [] and wake == 11 * MS


def test_a_backlogged_sequence_expires_with_its_requests():
    b = batcher(max_batch_size=1, instances=("a",))
    req(b, 1, FLAG_START)
    waiting = req(b, 2, FLAG_START, now=0, timeout_us=100)
    assert b.next_deadline() == 100_000
    assert b.expire(50_000) == []
    assert b.expire(100_000) == [waiting]
    assert 2 not in b.active and not b.backlog and len(b) == 1


def test_minimum_slot_utilization_waits_up_to_the_queue_delay():
    b = batcher(max_batch_size=4, instances=("a",), max_delay_us=100, min_slot_utilization=0.5)
    req(b, 1, FLAG_START, now=0)
    entries, wake = b.next_batch("a", 10_000)
    assert entries == [] and wake == 100_001
    req(b, 2, FLAG_START, now=20_000)             # 2 of 4 slots ready: utilization reached
    assert names(b.next_batch("a", 30_000)[0]) == [1, 2]


def test_a_lost_instance_fails_its_sequences_until_they_start_again():
    b = batcher(max_batch_size=1, instances=("a", "b"))
    start = req(b, 1, FLAG_START)                # on a
    req(b, 2, FLAG_START)                        # on b
    queued = req(b, 1)
    count, out = b.instance_lost("a", lost_message("m", "m_0", "died (killed by signal 9 (SIGKILL))"))
    assert count == 1 and len(out) == 2 and out[0] is start and out[1] is queued
    with pytest.raises(TritonError) as info:
        req(b, 1)
    assert info.value.code is Code.UNAVAILABLE
    assert info.value.message == (
        "sequence 1 of model 'm' was lost: instance 'm_0', which held its state, died (killed by signal 9 "
        "(SIGKILL)); send its next request with the START flag to begin again")
    req(b, 3, FLAG_START)                         # a is down: the new sequence waits
    assert b.active[3].slot is None
    b.instance_up("a", 0)
    assert b.active[3].slot.instance == "a"
    req(b, 1, FLAG_START)                         # a new START begins sequence 1 again (backlog)
    assert b.active[1].lost == "" and names(b.next_batch("b", 0)[0]) == [2]


def test_ending_a_sequence_returns_its_queued_requests_and_frees_the_slot():
    b = batcher(max_batch_size=1, instances=("a",))
    req(b, 1, FLAG_START)
    later = req(b, 1)
    req(b, 2, FLAG_START)
    items = b.end(b.active[1], 0)
    assert len(items) == 2 and later in items and len(b) == 1
    assert b.active[2].slot is not None


def test_oldest_issues_one_request_per_sequence_and_batches_the_oldest():
    b = batcher(max_batch_size=4, instances=("a",), oldest=True, max_candidates=3, preferred=[2])
    r1 = req(b, 1, FLAG_START, now=0)
    req(b, 1, now=1)
    r2 = req(b, 2, FLAG_START, now=2)
    req(b, 3, FLAG_START, now=3)
    req(b, 4, FLAG_START, now=4)                  # beyond the 3 candidate slots: backlog
    assert [s.corrid for s in b.backlog] == [4]
    batch, _ = b.next_batch("a", 10)
    assert batch == [r1, r2]                      # preferred size 2, oldest first
    batch, _ = b.next_batch("a", 10)
    assert names(batch) == [3]                    # sequence 1's next waits for its first
    b.done(r1, 20)
    assert names(b.next_batch("a", 20)[0]) == [1]


def test_oldest_frees_a_slot_when_the_end_is_issued_and_reuses_it_once_done():
    b = batcher(max_batch_size=2, instances=("a",), oldest=True, max_candidates=1)
    end = req(b, 1, FLAG_START | FLAG_END)
    req(b, 2, FLAG_START)
    assert b.active[2].slot is not None           # slot handed over when the END was issued
    assert b.next_batch("a", 0)[0] == [end]
    assert b.next_batch("a", 0)[0] == []          # the slot's request is still in flight
    b.done(end, 1)
    assert names(b.next_batch("a", 1)[0]) == [2]


def test_the_delay_hooks_hold_until_slots_and_backlog_hold_enough_requests():
    """TRITONSERVER_DELAY_SCHEDULER counts requests in slots, ..._BACKLOG_... requests of
    sequences waiting for a slot; both must be reached, once."""
    b = SequenceBatcher(SequenceBatching(), 1, ["a"], "m", hold_until=2, backlog_hold=2)
    req(b, 1, FLAG_START)
    req(b, 1)
    assert b.next_batch("a", 0) == ([], 0)           # 2 in the slot, none in the backlog
    req(b, 2, FLAG_START)
    assert b.next_batch("a", 0) == ([], 0)           # 1 in the backlog
    req(b, 2, FLAG_END)
    assert names(b.next_batch("a", 0)[0]) == [1]     # 2 and 2: released for good
    assert names(b.next_batch("a", 0)[0]) == [1]
