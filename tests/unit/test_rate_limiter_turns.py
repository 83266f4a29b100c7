"""The rate limiter's turns between instances that cannot execute together: priority 2 gets
every third turn against priority 1 (L0_rate_limiter's two models and resources)."""
from __future__ import annotations

from tritond.broker.scheduling.rate_limiter import RateLimiter, parse_resources
from tritond.broker.supervision.pool import Instance


class Version:
    """What the limiter reads of a model version: its config and its idle instances."""

    def __init__(self, name: str, limiter_config: dict) -> None:
        self.name = name
        self.instances = [Instance(model=name, version=1, index=0, name=f"{name}_0_0")]
        self.config = {"instance_group": [{"count": 1, "rate_limiter": limiter_config}]}

    def free_instances(self) -> list[Instance]:
        return self.instances


def test_priority_two_gets_every_third_turn():
    limiter = RateLimiter(parse_resources(["resource1:4", "resource2:2"]))
    first = Version("custom_zero_1_float32", {"resources": [{"name": "resource1", "count": 4}]})
    second = Version("custom_zero_1_float32_v2", {"resources": [
        {"name": "resource1", "count": 2}, {"name": "resource2", "global": True, "count": 2}], "priority": 2})
    for mv in (first, second):
        assert limiter.register(mv) == ""
    # the second model's request arrives first and runs; the first model's must wait
    assert limiter.grantable(second, second.free_instances()) == second.instances
    limiter.acquire(second.instances[0], 0)
    assert limiter.grantable(first, first.free_instances()) == []
    turns, last = [second.name], second
    for bid in range(1, 30):
        assert limiter.release(bid - 1)
        for mv in limiter.woken(last):      # what waits competes with the version that just ran
            granted = limiter.grantable(mv, mv.free_instances())
            if granted:
                limiter.acquire(granted[0], bid)
                turns.append(mv.name)
                last = mv
                break
        other = second if last is first else first
        assert limiter.grantable(other, other.free_instances()) == []   # resource1 is held
    a, b = first.name, second.name
    # the head start is made up (the first runs until its turn count catches up), then 2:1,
    # the tie at equal turns going to the higher priority
    assert turns[:12] == [b, a, a, a, a, b, a, a, b, a, a, b]
    assert turns[3:].count(a) == 2 * turns[3:].count(b)
