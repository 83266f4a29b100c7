"""Request queues and batch formation, with Triton's default and dynamic-batcher semantics.

Pure logic driven by the broker loop: `enqueue` admits or rejects, `next_batch` forms a batch
when an instance is free (or says how long to wait), `expire` applies queue-policy timeouts,
`pick_instance` chooses which free instance runs it. Times are integers in nanoseconds,
passed in, so tests drive a fake clock.

Queue layout follows Triton's PriorityQueue: one queue per priority level (level 1 first),
each followed by its DELAY-ed requests. A batch is always a prefix of that order, so taking
it is a run of pops from the front.
"""
from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tritond.wire.errors import unavailable
from tritond.wire.schema import Inline, ModelView, QueuePolicy

HARD_QUEUE_CAP = 16384  # never buffer without bound, even with max_queue_size 0


class TensorLike(Protocol):
    name: str
    shape: list[int]
    loc: Any


class InstanceLike(Protocol):
    name: str
    idle_since: float


@dataclass(eq=False, slots=True)
class Pending:
    """One admitted request waiting in a queue (compared by identity)."""
    key: Any                     # opaque handle the broker uses to answer
    arrival_ns: int
    batch_size: int
    shape_key: tuple             # what must be equal for two requests to share a batch
    level: int = 0
    deadline_ns: int = 0         # queue-policy timeout (0: none, or no longer queued)


def queue_timeout_us(qp: QueuePolicy, requested_us: int) -> int:
    """Triton's rule: a request's own timeout may only shorten the default, never add one."""
    if qp.allow_timeout_override and 0 < requested_us < qp.default_timeout_us:
        return requested_us
    return qp.default_timeout_us


@dataclass
class BatchPolicy:
    max_batch_size: int = 0
    dynamic: bool = False
    preferred: list[int] = field(default_factory=list)
    max_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    level_policies: dict[int, QueuePolicy] = field(default_factory=dict)
    equal_shape: frozenset[str] = frozenset()    # inputs whose shapes must match within a batch
    shape_tensors: frozenset[str] = frozenset()  # inputs whose contents must match too
    optional_inputs: bool = False                # batched requests must carry the same inputs

    @classmethod
    def from_view(cls, view: ModelView) -> "BatchPolicy":
        mbs = view.max_batch_size
        db = view.batching
        if db is None:
            return cls(max_batch_size=mbs)
        inputs = view.inputs.values()
        shape_tensors = frozenset(i.name for i in inputs if i.shape_tensor)
        variable = frozenset(i.name for i in inputs if -1 in i.dims and not i.ragged)
        preferred = list(db.preferred)
        if not preferred and mbs > 0:
            preferred = [mbs]
        return cls(
            max_batch_size=mbs,
            dynamic=True,
            preferred=preferred,
            max_delay_ns=db.max_delay_us * 1000,
            preserve_ordering=db.preserve_ordering,
            priority_levels=db.priority_levels,
            default_level=db.default_level,
            default_policy=db.default_policy,
            level_policies=dict(db.level_policies),
            equal_shape=variable | shape_tensors,
            shape_tensors=shape_tensors,
            optional_inputs=any(i.optional for i in inputs),
        )

    def shape_key(self, inputs: Sequence[TensorLike]) -> tuple:
        """What two requests must share to be batched: the shapes of variable-size inputs
        (without the batch dimension), shape tensors' contents, and with optional inputs the
        set of inputs given. Fixed-shape inputs batch freely."""
        if not self.dynamic:
            return ()
        skip = 1 if self.max_batch_size > 0 else 0
        key = []
        for d in inputs:
            if d.name in self.equal_shape:
                entry: tuple = (d.name, tuple(d.shape[skip:]))
                if d.name in self.shape_tensors:
                    # Contents are compared only when they travel inline; otherwise never equal.
                    entry += (d.loc.data if isinstance(d.loc, Inline) else object(),)
                key.append(entry)
            elif self.optional_inputs:
                key.append((d.name,))
        key.sort(key=lambda e: e[0])
        return tuple(key)


class Scheduler:
    """One per loaded model version. Holds queued requests; never executes anything."""

    def __init__(self, policy: BatchPolicy, hold_until: int = 0) -> None:
        self.policy = policy
        self.hold_until = hold_until    # test hook: no batch until this many are queued (once)
        # Levels get their queues when a request first uses them: priority_levels may be as
        # large as a uint64 (Triton keeps a map, so a config may name any count).
        self.queues: dict[int, deque[Pending]] = {}
        self.delayed: dict[int, deque[Pending]] = {}
        self._levels: list[int] = []                # levels with queues, ascending
        self.count = 0
        self.busy_ns: dict[str, int] = {}          # instance name -> time spent executing
        self._deadlines: list[tuple[int, int, Pending]] = []
        self._seq = 0
        self._max_preferred = policy.preferred[-1] if policy.preferred else 0
        self._preferred = frozenset(policy.preferred)
        self._max_batch = max(policy.max_batch_size, 1)

    def __len__(self) -> int:
        return self.count

    # ---------------------------------------------------------------- admission

    def level_of(self, priority: int) -> int:
        """Queue index for a request's `priority` (0 or out of range: the default level)."""
        p = self.policy
        if p.priority_levels <= 0:
            return 0
        if priority <= 0 or priority > p.priority_levels:
            priority = p.default_level or p.priority_levels
        return priority - 1

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.policy.level_policies.get(level + 1, self.policy.default_policy)

    def enqueue(self, item: Pending, priority: int, timeout_us: int, now_ns: int) -> None:
        """Admit a request or raise UNAVAILABLE 'Exceeds maximum queue size' (without Triton's
        request-id prefix, which the caller adds)."""
        level = self.level_of(priority)
        qp = self.queue_policy(level)
        if level not in self.queues:
            self.queues[level], self.delayed[level] = deque(), deque()
            bisect.insort(self._levels, level)
        size = len(self.queues[level]) + len(self.delayed[level])
        if (qp.max_queue_size and size >= qp.max_queue_size) or self.count >= HARD_QUEUE_CAP:
            raise unavailable("Exceeds maximum queue size")
        item.level = level
        item.deadline_ns = 0
        if self.policy.dynamic:
            timeout = queue_timeout_us(qp, timeout_us)
            if timeout:
                item.deadline_ns = now_ns + timeout * 1000
                self._seq += 1
                heapq.heappush(self._deadlines, (item.deadline_ns, self._seq, item))
        self.queues[level].append(item)
        self.count += 1

    def requeue_front(self, item: Pending) -> None:
        """Put a dispatched request back at the head of its level (retry after a worker died)."""
        item.deadline_ns = 0
        self.queues[item.level].appendleft(item)
        self.count += 1

    # ---------------------------------------------------------------- timeouts

    def next_deadline(self) -> int:
        """Earliest queue-timeout deadline of a queued request (0: none)."""
        heap = self._deadlines
        while heap and heap[0][2].deadline_ns != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else 0

    def expire(self, now_ns: int) -> list[Pending]:
        """Apply queue timeouts (deadline passed): REJECT removes and returns the requests,
        DELAY moves them behind the level's unexpired requests without a deadline."""
        due: dict[int, set[int]] = {}
        while (deadline := self.next_deadline()) and deadline < now_ns:
            _, _, item = heapq.heappop(self._deadlines)
            item.deadline_ns = 0
            due.setdefault(item.level, set()).add(id(item))
        rejected: list[Pending] = []
        for level, ids in due.items():
            q = self.queues[level]
            keep = [p for p in q if id(p) not in ids]
            late = [p for p in q if id(p) in ids]
            q.clear()
            q.extend(keep)
            if self.queue_policy(level).timeout_action == "DELAY":
                self.delayed[level].extend(late)
            else:
                rejected.extend(late)
        self.count -= len(rejected)
        return rejected

    def remove(self, pred: Callable[[Pending], bool]) -> list[Pending]:
        """Take out every queued request matching pred (unload, cancellation)."""
        out: list[Pending] = []
        for q in (*self.queues.values(), *self.delayed.values()):
            if any(pred(p) for p in q):
                keep = [p for p in q if not pred(p)]
                out.extend(p for p in q if pred(p))
                q.clear()
                q.extend(keep)
        for p in out:
            p.deadline_ns = 0
        self.count -= len(out)
        self._compact()
        return out

    # ---------------------------------------------------------------- batching

    def _in_order(self) -> Iterator[deque[Pending]]:
        """Each level's queue then its DELAY-ed requests, highest priority (level 1) first."""
        for level in self._levels:
            yield self.queues[level]
            yield self.delayed[level]

    def _ordered(self) -> Iterator[Pending]:
        for q in self._in_order():
            yield from q

    def _take(self, n: int) -> list[Pending]:
        out: list[Pending] = []
        for q in self._in_order():
            while q and len(out) < n:
                item = q.popleft()
                item.deadline_ns = 0
                out.append(item)
            if len(out) == n:
                break
        self.count -= n
        self._compact()
        return out

    def take_run(self, n: int) -> list[Pending]:
        """Up to `n` more requests from the front, in order, for a default scheduler's serial
        run (its queue holds no deadlines: those are a dynamic batcher's)."""
        return self._take(min(n, self.count))

    def _compact(self) -> None:
        """Entries of requests no longer queued linger until they reach the top; keep the heap
        (and the requests it references) proportional to what is still queued."""
        if len(self._deadlines) > 2 * self.count + 64:
            self._deadlines = [e for e in self._deadlines if e[2].deadline_ns == e[0]]
            heapq.heapify(self._deadlines)

    def next_batch(self, now_ns: int) -> tuple[list[Pending], int]:
        """Called when an instance is free: (batch, 0) to dispatch now, or ([], wake_ns) to look
        again at wake_ns (0: nothing queued).

        Triton's examination: walk the queue from the front while the batch stays within
        max_batch_size and shapes match, remembering the last prefix that hit a preferred
        size (or that would be overrun past the largest one). Send that prefix while the
        oldest request is within max_queue_delay; send everything walked when the next
        request cannot join, the largest preferred size is reached, or the delay is 0 or
        has passed; otherwise wait for the delay or the nearest timeout."""
        if self.count == 0:
            return [], 0
        if self.hold_until:
            if self.count < self.hold_until:
                return [], self.next_deadline()     # an enqueue looks again; so does a timeout
            self.hold_until = 0
        p = self.policy
        if not p.dynamic:
            return self._take(1), 0
        walked = 0
        total = 0
        best = 0
        send_now = False
        oldest = now_ns
        first_key: tuple = ()
        for item in self._ordered():
            size = item.batch_size
            if walked == 0:
                first_key = item.shape_key
            else:
                if total + size > self._max_preferred and best == 0:
                    best = walked
                if total + size > self._max_batch or item.shape_key != first_key:
                    send_now = True
                    break
            walked += 1
            total += size
            oldest = min(oldest, item.arrival_ns)
            if total in self._preferred:
                best = walked
        delay_exceeded = p.max_delay_ns > 0 and now_ns - oldest >= p.max_delay_ns
        if best and not delay_exceeded:
            return self._take(best), 0
        if send_now or total >= self._max_preferred or delay_exceeded or p.max_delay_ns == 0:
            return self._take(walked), 0
        wake = oldest + p.max_delay_ns
        deadline = self.next_deadline()
        if deadline:
            wake = min(wake, deadline + 1)
        return [], wake

    # ---------------------------------------------------------------- instances

    def pick_instance(self, free: Sequence[InstanceLike]) -> InstanceLike:
        """The least busy free instance: least time spent executing, then idle the longest."""
        return min(free, key=lambda i: (self.busy_ns.get(i.name, 0), i.idle_since))

    def note_busy(self, instance: str, ns: int) -> None:
        self.busy_ns[instance] = self.busy_ns.get(instance, 0) + ns
