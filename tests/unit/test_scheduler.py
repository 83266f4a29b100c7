"""The scheduler's batching and queue-policy rules, driven by a fake clock (times in ns)."""
from dataclasses import dataclass

import pytest

from tritond.broker.scheduling import batcher as scheduler
from tritond.broker.scheduling.batcher import BatchPolicy, Pending, Scheduler
from tritond.repository.view import model_view
from tritond.wire import schema as S
from tritond.wire.errors import TritonError as Rejected

US = 1000


def policy_of(config: dict) -> BatchPolicy:
    return BatchPolicy.from_view(model_view(config))


def make(**db) -> Scheduler:
    mbs = db.pop("max_batch_size", 8)
    inputs = db.pop("inputs", [{"name": "x", "dims": [4]}])
    return Scheduler(policy_of({"max_batch_size": mbs, "input": inputs, "dynamic_batching": db}))


def add(s: Scheduler, name: str, t: int, size: int = 1, key: tuple = (), priority: int = 0,
        timeout_us: int = 0) -> Pending:
    p = Pending(name, t, size, key)
    s.enqueue(p, priority, timeout_us, t)
    return p


def names(batch) -> list[str]:
    return [p.key for p in batch]


# ------------------------------------------------------------------ config


def test_preferred_defaults_to_max_batch_size():
    assert make(max_batch_size=16).policy.preferred == [16]
    assert make(preferred_batch_size=[4, 2, 4]).policy.preferred == [2, 4]
    assert make(max_batch_size=0).policy.preferred == []


def test_config_fields_are_read():
    p = policy_of({
        "max_batch_size": 8,
        "dynamic_batching": {
            "max_queue_delay_microseconds": 250, "preserve_ordering": True,
            "priority_levels": 3, "default_priority_level": 2,
            "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 7,
                                     "allow_timeout_override": True, "max_queue_size": 5},
            "priority_queue_policy": {"1": {"max_queue_size": 2}},
        },
    })
    assert (p.dynamic, p.max_delay_ns, p.preserve_ordering) == (True, 250 * US, True)
    assert (p.priority_levels, p.default_level) == (3, 2)
    assert p.default_policy == S.QueuePolicy("DELAY", 7, True, 5)
    assert p.level_policies == {1: S.QueuePolicy(max_queue_size=2)}


def test_without_dynamic_batching_each_request_runs_alone_in_order():
    s = Scheduler(policy_of({"max_batch_size": 8}))
    assert not s.policy.dynamic
    for i in range(3):
        add(s, f"r{i}", 0, timeout_us=1)
    assert s.expire(10**9) == []
    assert [names(s.next_batch(0)[0]) for _ in range(3)] == [["r0"], ["r1"], ["r2"]]
    assert s.next_batch(0) == ([], 0)


# ------------------------------------------------------------------ batch formation


def test_zero_delay_sends_whatever_is_queued():
    s = make()
    for i in range(3):
        add(s, f"r{i}", i)
    batch, wake = s.next_batch(10)
    assert (names(batch), wake, len(s)) == (["r0", "r1", "r2"], 0, 0)


def test_batch_never_exceeds_max_batch_size():
    s = make(max_batch_size=4)
    for i in range(6):
        add(s, f"r{i}", 0)
    assert names(s.next_batch(0)[0]) == ["r0", "r1", "r2", "r3"]
    assert names(s.next_batch(0)[0]) == ["r4", "r5"]


def test_short_queue_waits_for_the_delay():
    s = make(max_queue_delay_microseconds=100)
    add(s, "a", 1000)
    add(s, "b", 1500)
    assert s.next_batch(2000) == ([], 1000 + 100 * US)
    assert s.next_batch(1000 + 100 * US - 1) == ([], 1000 + 100 * US)
    batch, wake = s.next_batch(1000 + 100 * US)
    assert (names(batch), wake) == (["a", "b"], 0)


def test_preferred_size_goes_at_once_and_the_rest_waits():
    s = make(preferred_batch_size=[2, 4], max_queue_delay_microseconds=1000)
    for i in range(5):
        add(s, f"r{i}", 0)
    assert names(s.next_batch(1)[0]) == ["r0", "r1", "r2", "r3"]
    assert s.next_batch(1) == ([], 1000 * US)
    add(s, "r5", 2)
    assert names(s.next_batch(3)[0]) == ["r4", "r5"]


def test_largest_preferred_prefix_wins_before_the_delay():
    s = make(preferred_batch_size=[2, 5], max_queue_delay_microseconds=1000)
    for i in range(3):
        add(s, f"r{i}", 0)
    assert names(s.next_batch(1)[0]) == ["r0", "r1"]


def test_after_the_delay_everything_that_fits_goes():
    # Triton sends up to max_batch_size once the oldest request waited out the delay,
    # even past the largest preferred size.
    s = make(preferred_batch_size=[2], max_queue_delay_microseconds=100)
    for i in range(5):
        add(s, f"r{i}", 0)
    assert names(s.next_batch(100 * US)[0]) == ["r0", "r1", "r2", "r3", "r4"]


def test_preferred_size_with_zero_delay():
    s = make(preferred_batch_size=[2])
    for i in range(5):
        add(s, f"r{i}", 0)
    assert names(s.next_batch(0)[0]) == ["r0", "r1"]


def test_requests_with_their_own_batch_dimension():
    s = make(max_batch_size=8, max_queue_delay_microseconds=100)
    add(s, "a", 0, size=3)
    add(s, "b", 0, size=3)
    add(s, "c", 0, size=3)
    # 3+3 fits, 3 more would exceed 8: send the 6 now.
    assert names(s.next_batch(1)[0]) == ["a", "b"]
    add(s, "d", 0, size=5)
    assert names(s.next_batch(1)[0]) == ["c", "d"]


def test_request_reaching_the_largest_preferred_size_goes_at_once():
    s = make(max_batch_size=8, max_queue_delay_microseconds=10**6)
    add(s, "big", 0, size=8)
    assert names(s.next_batch(1)[0]) == ["big"]


def test_shape_mismatch_closes_the_batch():
    s = make(max_queue_delay_microseconds=1000)
    add(s, "a1", 0, key=("a",))
    add(s, "a2", 0, key=("a",))
    add(s, "b1", 0, key=("b",))
    add(s, "a3", 0, key=("a",))
    assert names(s.next_batch(1)[0]) == ["a1", "a2"]
    assert names(s.next_batch(1)[0]) == ["b1"]
    assert s.next_batch(1) == ([], 1000 * US)


def test_non_batching_model_with_dynamic_batching_runs_one_at_a_time():
    s = make(max_batch_size=0, max_queue_delay_microseconds=1000)
    add(s, "a", 0)
    add(s, "b", 0)
    assert names(s.next_batch(1)[0]) == ["a"]


# ------------------------------------------------------------------ shape keys


@dataclass
class T:
    name: str
    shape: list
    data: bytes | None = None

    @property
    def loc(self):
        return S.Inline(self.data) if self.data is not None else S.Block("seg", 0, 0)


def key(policy_inputs, request, mbs=8):
    return policy_of(
        {"max_batch_size": mbs, "input": policy_inputs, "dynamic_batching": {}}).shape_key(request)


def test_fixed_shape_inputs_batch_freely():
    inputs = [{"name": "x", "dims": [4]}]
    assert key(inputs, [T("x", [1, 4])]) == key(inputs, [T("x", [3, 4])]) == ()


def test_variable_dims_must_match_without_the_batch_dim():
    inputs = [{"name": "x", "dims": [-1]}, {"name": "y", "dims": [2]}]
    assert key(inputs, [T("x", [1, 5]), T("y", [1, 2])]) == key(inputs, [T("y", [4, 2]), T("x", [4, 5])])
    assert key(inputs, [T("x", [1, 5]), T("y", [1, 2])]) != key(inputs, [T("x", [1, 6]), T("y", [1, 2])])
    assert key(inputs, [T("x", [5])], mbs=0) != key(inputs, [T("x", [6])], mbs=0)


def test_ragged_inputs_are_not_compared():
    inputs = [{"name": "x", "dims": [-1], "allow_ragged_batch": True}]
    assert key(inputs, [T("x", [1, 5])]) == key(inputs, [T("x", [1, 6])])


def test_shape_tensors_compare_contents():
    inputs = [{"name": "s", "dims": [2], "is_shape_tensor": True}]
    assert key(inputs, [T("s", [1, 2], b"ab")]) == key(inputs, [T("s", [1, 2], b"ab")])
    assert key(inputs, [T("s", [1, 2], b"ab")]) != key(inputs, [T("s", [1, 2], b"cd")])
    assert key(inputs, [T("s", [1, 2])]) != key(inputs, [T("s", [1, 2])])


def test_optional_inputs_batch_only_with_the_same_set():
    inputs = [{"name": "x", "dims": [2]}, {"name": "o", "dims": [2], "optional": True}]
    assert key(inputs, [T("x", [1, 2])]) != key(inputs, [T("x", [1, 2]), T("o", [1, 2])])


def test_no_key_without_dynamic_batching():
    assert policy_of({"max_batch_size": 8, "input": [{"name": "x", "dims": [-1]}]}).shape_key(
        [T("x", [1, 3])]) == ()


# ------------------------------------------------------------------ priority


def test_higher_priority_levels_go_first_and_batch_across_levels():
    s = make(priority_levels=3, default_priority_level=3, max_queue_delay_microseconds=1000,
             preferred_batch_size=[3])
    add(s, "low", 0)
    add(s, "default", 0, priority=0)
    add(s, "out_of_range", 0, priority=7)
    add(s, "high", 1, priority=1)
    add(s, "mid", 2, priority=2)
    assert [p.level for p in s.queues[2]] == [2, 2, 2]
    assert names(s.next_batch(3)[0]) == ["high", "mid", "low"]
    assert names(s.next_batch(1000 * US)[0]) == ["default", "out_of_range"]


def test_priority_levels_up_to_uint64():
    """L0_model_queue's test_max_priority_levels: 2^64-1 levels, default level 2^32 (Triton keeps
    a map of levels; a queue per level up front would never finish)."""
    s = make(priority_levels=2**64 - 1, default_priority_level=2**32, max_queue_delay_microseconds=1000,
             preferred_batch_size=[4])
    add(s, "default", 0, size=2)
    add(s, "default2", 0)
    add(s, "high", 1, size=2, priority=1)
    add(s, "lowest", 2, priority=2**64 - 1)
    assert s.level_of(0) == 2**32 - 1
    assert names(s.next_batch(3)[0]) == ["high", "default"]
    assert names(s.next_batch(1000 * US)[0]) == ["default2", "lowest"]


def test_level_mapping():
    s = make(priority_levels=4, default_priority_level=2)
    assert [s.level_of(p) for p in (0, 1, 2, 3, 4, 5)] == [1, 0, 1, 2, 3, 1]
    assert make().level_of(3) == 0


# ------------------------------------------------------------------ queue policy


def test_max_queue_size_rejects_per_level():
    s = make(priority_levels=2, default_priority_level=2,
             default_queue_policy={"max_queue_size": 2},
             priority_queue_policy={"1": {"max_queue_size": 1}})
    add(s, "a", 0, priority=2)
    add(s, "b", 0, priority=2)
    with pytest.raises(Rejected, match="^Exceeds maximum queue size$"):
        add(s, "c", 0, priority=2)
    add(s, "h", 0, priority=1)
    with pytest.raises(Rejected):
        add(s, "h2", 0, priority=1)
    assert len(s) == 3


def test_hard_cap_bounds_an_unlimited_queue(monkeypatch):
    monkeypatch.setattr(scheduler, "HARD_QUEUE_CAP", 3)
    s = make()
    for i in range(3):
        add(s, f"r{i}", 0)
    with pytest.raises(Rejected):
        add(s, "r3", 0)


def test_reject_timeout_expires_only_after_the_deadline():
    s = make(max_queue_delay_microseconds=10**6, default_queue_policy={"default_timeout_microseconds": 100})
    add(s, "a", 0)
    add(s, "b", 50 * US)
    assert s.next_deadline() == 100 * US
    assert s.expire(100 * US) == []
    assert names(s.expire(100 * US + 1)) == ["a"]
    assert (len(s), s.next_deadline()) == (1, 150 * US)
    assert names(s.expire(10**9)) == ["b"]
    assert (len(s), s.next_deadline(), s.next_batch(10**9)) == (0, 0, ([], 0))


def test_wait_includes_the_nearest_timeout():
    s = make(max_queue_delay_microseconds=1000, default_queue_policy={"default_timeout_microseconds": 10})
    add(s, "a", 0)
    assert s.next_batch(1) == ([], 10 * US + 1)


def test_delay_action_moves_expired_requests_behind_the_rest():
    s = make(max_batch_size=2, default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": 10})
    add(s, "old", 0)
    add(s, "old2", 5 * US)
    assert s.expire(16 * US) == []
    add(s, "new", 17 * US)
    add(s, "new2", 18 * US)
    assert s.next_deadline() == 27 * US
    assert names(s.next_batch(19 * US)[0]) == ["new", "new2"]
    assert s.next_deadline() == 0
    assert names(s.next_batch(10**9)[0]) == ["old", "old2"]
    assert len(s) == 0


def test_delayed_requests_count_toward_max_queue_size():
    s = make(default_queue_policy={"timeout_action": "DELAY", "default_timeout_microseconds": 1,
                                   "max_queue_size": 1})
    add(s, "a", 0)
    s.expire(10**6)
    with pytest.raises(Rejected):
        add(s, "b", 10**6)


@pytest.mark.parametrize("policy, requested, expected", [
    ({"default_timeout_microseconds": 100, "allow_timeout_override": True}, 40, 40),
    ({"default_timeout_microseconds": 100, "allow_timeout_override": True}, 400, 100),
    ({"default_timeout_microseconds": 100, "allow_timeout_override": False}, 40, 100),
    ({"default_timeout_microseconds": 0, "allow_timeout_override": True}, 40, 0),
    ({"default_timeout_microseconds": 100, "allow_timeout_override": True}, 0, 100),
])
def test_request_timeout_may_only_shorten_the_default(policy, requested, expected):
    s = make(default_queue_policy=policy)
    p = add(s, "a", 1000, timeout_us=requested)
    assert p.deadline_ns == (1000 + expected * US if expected else 0)


def test_dispatched_requests_do_not_time_out():
    s = make(default_queue_policy={"default_timeout_microseconds": 10})
    add(s, "a", 0)
    assert names(s.next_batch(1)[0]) == ["a"]
    assert (s.next_deadline(), s.expire(10**9)) == (0, [])


def test_dispatched_requests_leave_the_timeout_heap():
    s = make(default_queue_policy={"default_timeout_microseconds": 10**9})
    for i in range(1000):
        add(s, f"r{i}", i)
        s.next_batch(i)
    assert len(s) == 0 and len(s._deadlines) <= 64


def test_remove_and_requeue_front():
    s = make(max_queue_delay_microseconds=1000, default_queue_policy={"default_timeout_microseconds": 10})
    for n in ("a", "b", "c"):
        add(s, n, 0)
    assert names(s.remove(lambda p: p.key == "b")) == ["b"]
    assert (len(s), names(s.next_batch(10**9)[0])) == (2, ["a", "c"])
    retry = Pending("retry", 0, 1, ())
    s.requeue_front(retry)
    add(s, "d", 10**9)
    assert names(s.next_batch(10**9)[0]) == ["retry", "d"]
    assert s.expire(10**12) == []


# ------------------------------------------------------------------ instances


@dataclass
class Inst:
    name: str
    idle_since: float


def test_least_busy_free_instance_is_picked():
    s = make()
    a, b, c = Inst("a", 3.0), Inst("b", 1.0), Inst("c", 2.0)
    assert s.pick_instance([a, b, c]) is b           # nobody has worked yet: idle longest
    s.note_busy("b", 500)
    s.note_busy("a", 100)
    assert s.pick_instance([a, b, c]) is c
    s.note_busy("c", 200)
    assert s.pick_instance([a, b, c]) is a
    assert s.pick_instance([b]) is b


def test_delay_scheduler_hook_holds_the_first_batch_until_enough_are_queued(monkeypatch):
    """TRITONSERVER_DELAY_SCHEDULER=<n> (Triton's test hook): no batch until n requests wait,
    then batching as configured, and the hold does not come back."""
    from tritond.broker import test_hooks
    monkeypatch.setenv(test_hooks.DELAY_SCHEDULER, "3")
    s = Scheduler(policy_of({"max_batch_size": 8, "input": [{"name": "x", "dims": [4]}],
                             "dynamic_batching": {"preferred_batch_size": [2]}}), test_hooks.delay_scheduler("m"))
    add(s, "a", 0)
    add(s, "b", 1)
    assert s.next_batch(2) == ([], 0)           # 2 queued, preferred size reached, still held
    add(s, "c", 3)
    batch, _ = s.next_batch(4)
    assert [p.key for p in batch] == ["a", "b"]
    add(s, "d", 5)
    assert [p.key for p in s.next_batch(6)[0]] == ["c", "d"]


@pytest.mark.parametrize("raw, count", [(None, 0), ("4", 4), ("x", 0), ("-2", 0)])
def test_delay_scheduler_hook_reads_the_environment_like_atoi(monkeypatch, raw, count):
    from tritond.broker import test_hooks
    monkeypatch.delenv(test_hooks.DELAY_SCHEDULER, raising=False)
    if raw is not None:
        monkeypatch.setenv(test_hooks.DELAY_SCHEDULER, raw)
    assert test_hooks.delay_scheduler("m") == count
