"""The one scheduling interface: how a model version's requests queue and form batches.

The request path (scheduling/path.py) calls only these methods, whatever the model's
scheduling is; each kind is one class that implements them (queued.py: Triton's default and
dynamic batchers; sequence.py: the sequence batcher), chosen once per model version when it
becomes READY (scheduling/factory.py). A new policy is one new file implementing `Scheduling`
plus one line of the factory.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from tritond.wire.errors import TritonError
from tritond.wire.schema import ExecRequest, Infer

from tritond.broker.clock import Clock
from tritond.broker.scheduling.batcher import Pending
from tritond.broker.tables.client_regions import ClientRegions

if TYPE_CHECKING:
    from tritond.broker.supervision.pool import Instance
    from tritond.broker.tables.inflight import Req
    from tritond.broker.tables.model_version import ModelVersion



class Batches(Protocol):
    """What a scheduling policy needs of the request path."""
    clock: Clock
    regions: ClientRegions
    keys: Iterator[int]
    limiter: Any                    # the rate limiter (None: --rate-limit=off)

    def free_instances(self, mv: "ModelVersion") -> list["Instance"]: ...
    def send_batch(self, mv: "ModelVersion", inst: "Instance", reqs: list["Req"], now_ns: int,
                   requests: list[ExecRequest] | None = None, serial: bool = False) -> None: ...
    def extend_run(self, mv: "ModelVersion", inst: "Instance", reqs: list["Req"], now_ns: int) -> None: ...
    def fail(self, req: "Req", err: TritonError, reason: str = "OTHER") -> None: ...
    def at_turn_end(self, mv: "ModelVersion") -> None: ...
    def wake_at(self, mv: "ModelVersion", at_ns: int) -> None: ...
    def reap_by(self, at_ns: int) -> None: ...
    def send_worker(self, ident: bytes, msg: Any) -> None: ...


class Scheduling(Protocol):
    """One per READY model version (`ModelVersion.scheduler`)."""
    preserve_ordering: bool         # answers leave in dispatch order
    may_retry: bool                 # a lost batch's requests may run again (idempotent models)
    iterative: bool                 # the model may release requests to run again (iterative sequences)

    def __len__(self) -> int:
        """Requests queued and not yet dispatched."""

    def admit(self, req: "Req", msg: Infer, now_ns: int) -> None:
        """Queue `req` (its `pending` set here); raises TritonError with the text to answer."""

    def check(self, msg: Infer) -> None:
        """The policy's checks of a request before its regions are resolved (raises)."""

    def dispatch(self, mv: "ModelVersion") -> None:
        """Something changed (an arrival, a free instance): form the batches that are due."""

    def at_turn_end(self, mv: "ModelVersion") -> None:
        """Form the batches `dispatch` left for the end of the loop turn."""

    def extend(self, mv: "ModelVersion", inst: "Instance", left: int) -> None:
        """`inst`'s serial run has `left` requests to go and requests queue: hand it the next
        run now if it would otherwise wait for it (path.extend_run)."""

    def expire(self, mv: "ModelVersion", now_ns: int) -> None:
        """Answer the queued requests whose timeout passed."""

    def next_deadline(self) -> int:
        """When `expire` has work next (ns, 0: none)."""

    def reap(self, mv: "ModelVersion", now_ns: int) -> int:
        """Idle state the policy keeps (sequences); returns the next time to look (0: none)."""

    def finished(self, req: "Req", now_ns: int) -> None:
        """`req` was answered (done, failed, cancelled)."""

    def cancel(self, req: "Req") -> None:
        """The requester gave up on a queued request."""

    def instance_lost(self, mv: "ModelVersion", inst: "Instance", how: str) -> None:
        """`inst`'s worker died; its batch was already answered."""

    def resized(self, added: list["Instance"], removed: list["Instance"]) -> None:
        """A load changed the version's instances in place (lifecycle/resize.py): `removed`
        take no new work but what only they can finish."""

    def holds(self, inst: "Instance") -> bool:
        """`inst` owes work only it can do (a sequence bound to it): a removed one stays."""

    def forget(self, inst: "Instance") -> None:
        """A removed instance stopped: it is gone for good."""

    def remove(self, pred: Callable[[Pending], bool]) -> list[Pending]:
        """Take out every queued request matching `pred`."""

    def requeue_front(self, item: Pending) -> None:
        """Put a request of a lost batch back at the head of the queue."""

    def note_busy(self, instance: str, ns: int, requests: int = 1, executed_ns: int = 0) -> None:
        """`instance` was busy `ns` with `requests` requests, whose execution in the worker took
        `executed_ns`."""
