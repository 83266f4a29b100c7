"""The sequence batcher's bookkeeping, with Triton's semantics (core: sequence_batch_scheduler):
correlation ids bound to slots of instances from START to END, a backlog for sequences beyond
the slots, idle reaping, and which requests form an instance's next batch.

Pure logic driven by the broker loop with times passed in (nanoseconds), so tests use a fake
clock. Requests are the scheduler's `Pending` items; what they stand for is the caller's
business (sequence.py turns batches into Exec messages with control inputs).

Direct: an instance has max(1, max_batch_size) slots; its batch holds the first queued request
of every slot from slot 0 to the highest slot with one queued, and padding (None) for the slots
between without one, so a request always sits at its slot's index.
Oldest: an instance has max_candidate_sequences slots; a sequence has at most one request
issued at a time, and issued requests are batched by the instance's own dynamic batcher, oldest
first. In both, a new sequence takes the free slot with the lowest index (spreading sequences
over instances), or waits in the backlog, first come first served.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

from tritond.wire.errors import invalid, unavailable
from tritond.wire.schema import SequenceBatching

from tritond.broker.scheduling.batcher import BatchPolicy, Pending, Scheduler

FLAG_START = 1
FLAG_END = 2
BACKLOG_EXPIRED = "timeout of the corresponding sequence has been expired"
# A sequence lost with its worker keeps failing clearly at least this long (a restart takes a
# while; an idle timeout alone would soon turn the error into "must specify the START flag").
LOST_KEEP_NS = 300 * 1_000_000_000


def corrid_text(corrid: int | str) -> str:
    return str(corrid)


@dataclass(eq=False)
class Slot:
    instance: str
    index: int
    order: int                          # the instance's position, for a stable choice among equals
    seq: "Sequence | None" = None
    busy: bool = False                  # oldest: a request issued from this slot is not done


@dataclass(eq=False)
class Sequence:
    key: int                            # the broker's name for it (the worker's state is kept under it)
    corrid: int | str
    queue: deque = field(default_factory=deque)     # (Pending, flags) not yet in a batch or issued
    slot: Slot | None = None
    last_ns: int = 0                    # arrival of its latest request (idle timer)
    ended: bool = False                 # its END arrived: the correlation id is free again
    issued: int = 0                     # requests in a batch (or issued) and not done
    lost: str = ""                      # why its state is gone (its worker died)
    deadline_ns: int = 0                # backlog timeout (0: none)


class SequenceBatcher:
    """One per loaded sequence-batched model version."""

    def __init__(self, view: SequenceBatching, max_batch_size: int, instances: Seq[str], model: str = "",
                 hold_until: int = 0, backlog_hold: int = 0) -> None:
        self.view = view
        self.hold_until = hold_until        # test hooks, as Triton's: no batch until this many requests
        self.backlog_hold = backlog_hold    # wait in slots and (with hold_until) this many in the backlog
        self.model = model
        self.oldest = view.oldest
        self.max_batch = max(1, max_batch_size)
        per_instance = view.max_candidates if self.oldest and view.max_candidates > 0 else self.max_batch
        self.per_instance = per_instance
        self.slots = {name: [Slot(name, i, n) for i in range(per_instance)] for n, name in enumerate(instances)}
        self.orders = itertools.count(len(self.slots))
        self.closing: set[str] = set()       # instances a resize removed: no new sequence binds there
        self.free: list[tuple[int, int, Slot]] = [(s.index, s.order, s) for slots in self.slots.values()
                                                  for s in slots]
        heapq.heapify(self.free)
        self.down: set[str] = set()          # instances whose worker died; their slots wait for it
        self.active: dict[int | str, Sequence] = {}     # correlation id -> sequence (before its END)
        self.reap_at = 0                     # no sequence can be idle before this (0: none active)
        self.backlog: deque[Sequence] = deque()
        self.deadline = 0                    # earliest backlog timeout (0: none; may be stale-early)
        self.owner: dict[Pending, Sequence] = {}
        self.issued_on: dict[Pending, Slot] = {}         # oldest: the slot a request was issued from
        self.count = 0
        self.keys = itertools.count(1)
        self.policy = BatchPolicy(max_batch_size=max_batch_size)
        self.batchers: dict[str, Scheduler] = {}
        if self.oldest:
            preferred = list(view.preferred) or ([max_batch_size] if max_batch_size > 0 else [])
            self.policy = BatchPolicy(max_batch_size=max_batch_size, dynamic=True, preferred=preferred,
                                      max_delay_ns=view.max_delay_us * 1000,
                                      preserve_ordering=view.preserve_ordering)
            self.batchers = {name: Scheduler(self.policy) for name in instances}

    def __len__(self) -> int:
        """Requests queued here (backlog, slots, issued and not yet in a batch)."""
        return self.count

    # ---------------------------------------------------------------- admission

    def enqueue(self, item: Pending, corrid: int | str, flags: int, timeout_us: int, now_ns: int) -> Sequence:
        """Admit a request of sequence `corrid` or raise Triton's error (INVALID_ARG without START
        for an unknown id; UNAVAILABLE for a sequence whose worker died)."""
        start = bool(flags & FLAG_START)
        seq = self.active.get(corrid)
        if seq is not None and seq.lost:
            if start or flags & FLAG_END:
                del self.active[corrid]
            if not start:
                raise unavailable(seq.lost)
            seq = None
        if seq is None:
            if not start:
                raise invalid(f"inference request for sequence {corrid_text(corrid)} to model '{self.model}' must "
                              f"specify the START flag on the first request of the sequence")
            seq = Sequence(next(self.keys), corrid)
            self.active[corrid] = seq
            if not self.reap_at:
                self.reap_at = now_ns + self.view.max_idle_us * 1000
            if not self._bind(seq):
                self.backlog.append(seq)
        seq.queue.append((item, flags))
        seq.last_ns = now_ns
        self.owner[item] = seq
        self.count += 1
        if seq.slot is None and timeout_us:
            deadline = now_ns + timeout_us * 1000
            seq.deadline_ns = min(seq.deadline_ns, deadline) if seq.deadline_ns else deadline
            self.deadline = min(self.deadline, deadline) if self.deadline else deadline
        if flags & FLAG_END:
            seq.ended = True
            del self.active[corrid]
        if self.oldest and seq.slot is not None:
            self._issue(seq.slot, now_ns)
        return seq

    def _bind(self, seq: Sequence) -> bool:
        """Give `seq` the free slot with the lowest index on a live instance, if there is one."""
        skipped = []
        slot = None
        while self.free:
            entry = heapq.heappop(self.free)
            if entry[2].instance in self.closing:
                continue
            if entry[2].instance in self.down:
                skipped.append(entry)
                continue
            slot = entry[2]
            break
        for entry in skipped:
            heapq.heappush(self.free, entry)
        if slot is None:
            return False
        slot.seq = seq
        seq.slot = slot
        seq.deadline_ns = 0
        return True

    def _release(self, slot: Slot, now_ns: int) -> None:
        """The slot's sequence is done with it: the oldest backlog sequence takes it, or it is free."""
        if slot.seq is not None and slot.seq.slot is slot:
            slot.seq.slot = None
        slot.seq = None
        if slot.instance in self.closing:
            return
        if slot.instance not in self.down and self.backlog:
            seq = self.backlog.popleft()
            slot.seq, seq.slot, seq.deadline_ns = seq, slot, 0
            if self.oldest:
                self._issue(slot, now_ns)
            return
        heapq.heappush(self.free, (slot.index, slot.order, slot))

    # ---------------------------------------------------------------- batches

    def next_batch(self, instance: str, now_ns: int) -> tuple[list[Pending | None], int]:
        """For a free instance: (entries, 0) to run now (None: a padding slot), or ([], wake_ns)
        to look again then (0: nothing to run)."""
        if self.hold_until:
            in_slots = sum(len(s.seq.queue) for slots in self.slots.values() for s in slots if s.seq is not None)
            if in_slots < self.hold_until or sum(len(q.queue) for q in self.backlog) < self.backlog_hold:
                return [], 0                # an enqueue looks again
            self.hold_until = 0
        if self.oldest:
            batch, wake = self.batchers[instance].next_batch(now_ns)
            self.count -= len(batch)
            return list(batch), wake
        slots = self.slots[instance]
        ready = [s for s in slots if s.seq is not None and s.seq.queue]
        if not ready:
            return [], 0
        view = self.view
        if view.max_delay_us and view.min_slot_utilization:
            oldest = min(s.seq.queue[0][0].arrival_ns for s in ready)
            if (now_ns - oldest <= view.max_delay_us * 1000
                    and len(ready) / self.max_batch < view.min_slot_utilization):
                return [], oldest + view.max_delay_us * 1000 + 1
        shape = ready[0].seq.queue[0][0].shape_key
        entries: list[Pending | None] = []
        for slot in slots[:ready[-1].index + 1]:
            seq = slot.seq
            if seq is None or not seq.queue or seq.queue[0][0].shape_key != shape:
                entries.append(None)
                continue
            item, flags = seq.queue.popleft()
            self.count -= 1
            seq.issued += 1
            entries.append(item)
            if flags & FLAG_END:
                self._release(slot, now_ns)
        return entries, 0

    def _issue(self, slot: Slot, now_ns: int) -> None:
        """Oldest: hand the next request of the slot's sequence to the instance's dynamic batcher
        unless one of the slot's requests is still in flight."""
        seq = slot.seq
        if slot.busy or seq is None or not seq.queue:
            return
        item, flags = seq.queue.popleft()
        slot.busy = True
        seq.issued += 1
        self.issued_on[item] = slot
        self.batchers[slot.instance].enqueue(item, 0, 0, now_ns)
        if flags & FLAG_END:
            self._release(slot, now_ns)

    def done(self, item: Pending, now_ns: int) -> None:
        """A request that was in a batch is answered (oldest: the slot may issue the next)."""
        seq = self.owner.pop(item, None)
        if seq is not None:
            seq.issued -= 1
        slot = self.issued_on.pop(item, None)
        if slot is not None:
            slot.busy = False
            if slot.seq is not None:
                self._issue(slot, now_ns)

    # ---------------------------------------------------------------- timers

    def next_deadline(self) -> int:
        """Earliest backlog timeout (0: none)."""
        return self.deadline

    def expire(self, now_ns: int) -> list[Pending]:
        """Backlogged sequences whose timeout passed leave; their requests are returned (Triton
        answers them UNAVAILABLE BACKLOG_EXPIRED)."""
        if not self.deadline or now_ns < self.deadline:
            return []
        out: list[Pending] = []
        keep: deque[Sequence] = deque()
        for seq in self.backlog:
            if seq.deadline_ns and seq.deadline_ns <= now_ns:
                out.extend(self._drop(seq))
            else:
                keep.append(seq)
        self.backlog = keep
        self.deadline = min((s.deadline_ns for s in keep if s.deadline_ns), default=0)
        return out

    def reap(self, now_ns: int) -> tuple[list[Sequence], int]:
        """Forget sequences idle for max_sequence_idle_microseconds (nothing queued or running),
        freeing their slots, and lost ones after LOST_KEEP_NS; returns them (their state must
        go) and when to look again (0: never)."""
        idle_ns = self.view.max_idle_us * 1000
        reaped = []
        wake = 0
        if now_ns < self.reap_at:
            return reaped, self.reap_at
        for corrid, seq in list(self.active.items()):
            due = seq.last_ns + (max(idle_ns, LOST_KEEP_NS) if seq.lost else idle_ns)
            if due <= now_ns:
                if not seq.queue and not seq.issued:
                    del self.active[corrid]
                    reaped.append(seq)
                    if seq.slot is not None:
                        self._release(seq.slot, now_ns)
                    continue
                due = now_ns + idle_ns          # still busy: look again an idle period later
            wake = min(wake, due) if wake else due
        self.reap_at = wake
        return reaped, wake

    # ---------------------------------------------------------------- removal and failures

    def _drop(self, seq: Sequence) -> list[Pending]:
        """Take `seq`'s queued requests out and forget it (its slot, if any, is the caller's)."""
        items = [item for item, _ in seq.queue]
        seq.queue.clear()
        self.count -= len(items)
        for item in items:
            self.owner.pop(item, None)
        if self.active.get(seq.corrid) is seq:
            del self.active[seq.corrid]
        return items

    def end(self, seq: Sequence, now_ns: int) -> list[Pending]:
        """End a sequence at once (one of its requests was cancelled): its queued requests are
        returned, its slot freed and its correlation id forgotten."""
        items = self._drop(seq)
        if seq in self.backlog:
            self.backlog.remove(seq)
        if seq.slot is not None:
            for batcher in self.batchers.values():
                taken = batcher.remove(lambda p: self.owner.get(p) is seq)
                for p in taken:
                    self.issued_on.pop(p, None)
                    self.owner.pop(p, None)
                    seq.issued -= 1
                items.extend(taken)
                self.count -= len(taken)
            slot = seq.slot
            slot.busy = slot.busy and seq.issued > 0     # a request still executes
            self._release(slot, now_ns)
        return items

    def instance_lost(self, instance: str, reason: Callable[[Sequence], str]) -> tuple[int, list[Pending]]:
        """The worker of `instance` died with the state of its sequences: each is marked lost
        (its next requests fail with `reason(seq)` until a new START); returns how many and
        their queued requests. Its slots wait for the restarted worker."""
        self.down.add(instance)
        out: list[Pending] = []
        count = 0
        for slot in self.slots.get(instance, ()):
            seq = slot.seq
            slot.busy = False
            if seq is None:
                continue
            count += 1
            seq.lost = reason(seq)
            self.reap_at = self.reap_at or 1
            out.extend(self._drop(seq))
            if not seq.ended:
                self.active[seq.corrid] = seq
            slot.seq = seq.slot = None
            heapq.heappush(self.free, (slot.index, slot.order, slot))
        if self.oldest:
            issued = self.batchers[instance].remove(lambda _: True)
            for p in issued:
                self.issued_on.pop(p, None)
                self.owner.pop(p, None)
            self.count -= len(issued)
            out.extend(issued)
        return count, out

    def add_instance(self, instance: str, now_ns: int) -> None:
        """A resize added an instance: its slots take sequences from now on."""
        order = next(self.orders)
        self.slots[instance] = [Slot(instance, i, order) for i in range(self.per_instance)]
        for slot in self.slots[instance]:
            heapq.heappush(self.free, (slot.index, slot.order, slot))
        if self.oldest:
            self.batchers[instance] = Scheduler(self.policy)
        while self.backlog and self._bind(self.backlog[0]):
            seq = self.backlog.popleft()
            if self.oldest:
                self._issue(seq.slot, now_ns)

    def close_instance(self, instance: str) -> None:
        """A resize removed an instance: the sequences bound to it run to their end there."""
        self.closing.add(instance)

    def holds(self, instance: str) -> bool:
        """A sequence is still bound to one of the instance's slots."""
        return any(slot.seq is not None for slot in self.slots.get(instance, ()))

    def forget_instance(self, instance: str) -> None:
        self.slots.pop(instance, None)
        self.batchers.pop(instance, None)
        self.closing.discard(instance)
        self.down.discard(instance)
        self.free = [entry for entry in self.free if entry[2].instance != instance]
        heapq.heapify(self.free)

    def instance_up(self, instance: str, now_ns: int) -> None:
        """The instance serves again: backlogged sequences may take its slots."""
        if instance not in self.down:
            return
        self.down.discard(instance)
        while self.backlog:
            seq = self.backlog[0]
            if not self._bind(seq):
                return
            self.backlog.popleft()
            if self.oldest:
                self._issue(seq.slot, now_ns)

    def remove(self, pred: Callable[[Pending], bool]) -> list[Pending]:
        """Take out every queued request matching pred (unload)."""
        out: list[Pending] = []
        for seq in [*self.backlog, *(s.seq for slots in self.slots.values() for s in slots if s.seq)]:
            keep: deque = deque()
            for entry in seq.queue:
                (out.append(entry[0]) if pred(entry[0]) else keep.append(entry))
            seq.queue = keep
        for batcher in self.batchers.values():
            out.extend(batcher.remove(pred))
        for item in out:
            self.owner.pop(item, None)
            slot = self.issued_on.pop(item, None)
            if slot is not None:
                slot.busy = False
        self.count -= len(out)
        return out

    def note_busy(self, instance: str, ns: int, requests: int = 1, executed_ns: int = 0) -> None:
        """Which instance runs a batch is decided by the slots, not by how busy it was."""


def lost_message(model: str, instance: str, how: str) -> Callable[[Sequence], str]:
    def reason(seq: Sequence) -> str:
        return (f"sequence {corrid_text(seq.corrid)} of model '{model}' was lost: instance '{instance}', which held "
                f"its state, {how}; send its next request with the START flag to begin again")
    return reason
