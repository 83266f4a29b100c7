"""Requests the broker has admitted and still owes an answer, and the batches executing.

A request is queued in its model's scheduler until dispatched; from then until its worker
answers it sits here under its batch id. Replies go through `reply`, a callable bound to the
requester (a frontend, a worker's BLS call, an ensemble step)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tritond.wire.schema import Infer, InferReply

from tritond.broker.scheduling.batcher import Pending

if TYPE_CHECKING:
    from tritond.broker.tables.model_version import ModelVersion

ReplyTo = Callable[[InferReply], None]


@dataclass(eq=False, slots=True)
class Req:
    reply: ReplyTo
    msg: Infer
    mv: "ModelVersion"
    arrival_ns: int
    pending: Pending
    dispatch_ns: int = 0
    order: int = -1                  # preserve_ordering sequence number (-1: not ordered)
    responded: bool = False          # a decoupled request's first response went out
    retry_of: str = ""             # why it runs again: its first attempt's worker death ('' when not)
    cancelled: bool = False          # its requester gave up while it executed
    regions: list = field(default_factory=list)
    trace: Any = None                # broker/observe/tracing.py Trace, when this request is traced
    key: int = 0                     # the broker's name for it towards workers (ExecRequest.key)
    worker: bytes = b""              # identity of the worker it was dispatched to
    seq: Any = None                  # its sequence (sequence-batched models)


class InflightTable:
    """Batch id -> the requests of that batch, while a worker executes it."""

    def __init__(self) -> None:
        self._batches: dict[int, list[Req]] = {}
        self._last = 0

    def add(self, reqs: list[Req]) -> int:
        self._last += 1
        self._batches[self._last] = reqs
        return self._last

    def pop(self, bid: int | None) -> list[Req]:
        """The requests of batch `bid` (none when unknown or already answered)."""
        if bid is None:
            return []
        return self._batches.pop(bid, None) or []

    def answered(self, bid: int, n: int) -> list[Req]:
        """The first `n` requests of batch `bid`, which leave it (a serial run's results so
        far); the rest stay until the batch ends."""
        reqs = self._batches.get(bid)
        if not reqs:
            return []
        self._batches[bid] = reqs[n:]
        return reqs[:n]

    def extend(self, bid: int, reqs: list[Req]) -> None:
        """More requests for batch `bid`, answered after the ones it holds."""
        self._batches[bid] = self._batches.get(bid, []) + reqs

    def count(self, bid: int) -> int:
        """The requests of batch `bid` not yet answered."""
        return len(self._batches.get(bid) or ())

    def take_all(self) -> list[Req]:
        """Every executing request, leaving the table empty (cancel-all at the exit timeout)."""
        out = [r for reqs in self._batches.values() for r in reqs]
        self._batches.clear()
        return out

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, bid: int) -> bool:
        return bid in self._batches
