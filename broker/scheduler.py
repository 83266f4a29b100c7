"""Request queues and batch formation, with Triton's default and dynamic-batcher semantics.

Pure logic driven by the broker loop: `enqueue` admits or rejects, `next_batch` forms a batch
when an instance is free (or says how long to wait), `expire` applies queue-policy timeouts.
Times are integers in nanoseconds, passed in, so tests can drive a fake clock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

HARD_QUEUE_CAP = 16384  # never buffer without bound, even with max_queue_size 0


@dataclass
class Pending:
    """One admitted request waiting in a queue."""
    key: Any                     # opaque handle the broker uses to answer
    arrival_ns: int
    batch_size: int
    shape_key: tuple             # shapes of variable dims that must match to batch together
    level: int = 0
    deadline_ns: int = 0         # 0: no queue timeout
    delayed: bool = False        # DELAY policy: timed out, kept behind the rest
    seq: int = 0


@dataclass
class QueuePolicy:
    timeout_action: str = "REJECT"     # REJECT | DELAY
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass
class BatchPolicy:
    max_batch_size: int = 0
    dynamic: bool = False
    preferred: list[int] = field(default_factory=list)
    max_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_level: int = 0
    default_policy: QueuePolicy = field(default_factory=QueuePolicy)
    level_policies: dict[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: dict) -> "BatchPolicy":
        """Build from a Triton config JSON dict (as rendered by GET /config)."""
        mbs = int(cfg.get("max_batch_size", 0) or 0)
        db = cfg.get("dynamic_batching")
        if not db:
            return cls(max_batch_size=mbs)

        def qp(d: dict | None) -> QueuePolicy:
            d = d or {}
            return QueuePolicy(
                timeout_action=str(d.get("timeout_action", "REJECT")),
                default_timeout_us=int(d.get("default_timeout_microseconds", 0) or 0),
                allow_timeout_override=bool(d.get("allow_timeout_override", False)),
                max_queue_size=int(d.get("max_queue_size", 0) or 0),
            )

        preferred = sorted(int(x) for x in db.get("preferred_batch_size", []) or [])
        if not preferred and mbs > 0:
            preferred = [mbs]
        levels = int(db.get("priority_levels", 0) or 0)
        default_policy = qp(db.get("default_queue_policy"))
        per_level = {int(k): qp(v) for k, v in (db.get("priority_queue_policy") or {}).items()}
        return cls(
            max_batch_size=mbs,
            dynamic=True,
            preferred=preferred,
            max_delay_ns=int(db.get("max_queue_delay_microseconds", 0) or 0) * 1000,
            preserve_ordering=bool(db.get("preserve_ordering", False)),
            priority_levels=levels,
            default_level=int(db.get("default_priority_level", 0) or 0),
            default_policy=default_policy,
            level_policies=per_level,
        )


class Rejected(Exception):
    """Admission refused (queue full); message is Triton's text without the request-id prefix."""


class Scheduler:
    """One per loaded model version. Holds queued requests; never executes anything."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        n = max(policy.priority_levels, 1)
        self.queues: list[deque[Pending]] = [deque() for _ in range(n)]
        self.count = 0
        self._seq = 0

    def __len__(self) -> int:
        return self.count

    def _level(self, priority: int) -> int:
        p = self.policy
        if p.priority_levels <= 0:
            return 0
        if priority <= 0 or priority > p.priority_levels:
            priority = p.default_level or p.priority_levels
        return min(max(priority, 1), p.priority_levels) - 1

    def _queue_policy(self, level: int) -> QueuePolicy:
        return self.policy.level_policies.get(level + 1, self.policy.default_policy)

    def enqueue(self, item: Pending, priority: int, timeout_us: int, now_ns: int) -> None:
        """Admit a request or raise Rejected('Exceeds maximum queue size')."""
        level = self._level(priority)
        qp = self._queue_policy(level)
        q = self.queues[level]
        limit = qp.max_queue_size if qp.max_queue_size > 0 else HARD_QUEUE_CAP
        if len(q) >= limit:
            raise Rejected("Exceeds maximum queue size")
        timeout = qp.default_timeout_us
        if timeout_us and qp.allow_timeout_override:
            timeout = timeout_us
        item.level = level
        item.deadline_ns = now_ns + timeout * 1000 if (timeout and self.policy.dynamic) else 0
        self._seq += 1
        item.seq = self._seq
        q.append(item)
        self.count += 1

    def expire(self, now_ns: int) -> list[Pending]:
        """Apply queue timeouts: REJECT removes and returns them, DELAY moves them to the back."""
        rejected: list[Pending] = []
        for level, q in enumerate(self.queues):
            if not q or not any(p.deadline_ns and p.deadline_ns <= now_ns for p in q):
                continue
            action = self._queue_policy(level).timeout_action
            keep: list[Pending] = []
            late: list[Pending] = []
            for p in q:
                if p.deadline_ns and p.deadline_ns <= now_ns:
                    if action == "DELAY":
                        p.deadline_ns = 0
                        p.delayed = True
                        late.append(p)
                    else:
                        rejected.append(p)
                else:
                    keep.append(p)
            q.clear()
            q.extend(keep)
            q.extend(late)
        self.count -= len(rejected)
        return rejected

    def remove(self, pred) -> list[Pending]:
        """Take out every queued request matching pred (cancellation, shutdown)."""
        out: list[Pending] = []
        for q in self.queues:
            keep = [p for p in q if not pred(p)]
            if len(keep) != len(q):
                out.extend(p for p in q if pred(p))
                q.clear()
                q.extend(keep)
        self.count -= len(out)
        return out

    def _ordered(self):
        for q in self.queues:
            yield from q

    def next_batch(self, now_ns: int) -> tuple[list[Pending], int]:
        """(batch, 0) to dispatch now, or ([], wake_ns) to wait until wake_ns (0: nothing queued)."""
        if self.count == 0:
            return [], 0
        p = self.policy
        if not p.dynamic:
            for q in self.queues:
                if q:
                    self.count -= 1
                    return [q.popleft()], 0
        first: Pending | None = None
        chosen: list[Pending] = []
        total = 0
        best_preferred = 0      # number of requests when a preferred size was last hit
        blocked = False          # next request does not fit or does not match
        for item in self._ordered():
            if first is None:
                first = item
            elif item.shape_key != first.shape_key or total + item.batch_size > p.max_batch_size:
                blocked = True
                break
            if total + item.batch_size > max(p.max_batch_size, 1) and chosen:
                blocked = True
                break
            chosen.append(item)
            total += item.batch_size
            if total in p.preferred:
                best_preferred = len(chosen)
            if p.preferred and total >= p.preferred[-1]:
                break
        assert first is not None
        oldest = min(c.arrival_ns for c in chosen)
        waited = now_ns - oldest
        max_pref = p.preferred[-1] if p.preferred else p.max_batch_size
        dispatch = (
            p.max_delay_ns == 0
            or total >= max_pref
            or blocked
            or waited >= p.max_delay_ns
        )
        if not dispatch and best_preferred:
            chosen = chosen[:best_preferred]
            dispatch = True
        if not dispatch:
            wake = oldest + p.max_delay_ns
            for item in self._ordered():
                if item.deadline_ns:
                    wake = min(wake, item.deadline_ns)
            return [], wake
        taken = {id(c) for c in chosen}
        for q in self.queues:
            if q and any(id(x) in taken for x in q):
                remaining = [x for x in q if id(x) not in taken]
                q.clear()
                q.extend(remaining)
        self.count -= len(chosen)
        return chosen, 0

    def next_deadline(self) -> int:
        """Earliest queue-timeout deadline (0: none)."""
        d = [x.deadline_ns for x in self._ordered() if x.deadline_ns]
        return min(d) if d else 0
