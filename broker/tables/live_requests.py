"""Requests a requester may still cancel or credit, by (requester identity, its request id).

A frontend cancels a request when its client goes away, and credits a streaming request as it
writes its replies out; a BLS caller cancels the iterator of a decoupled call. Each admitted
request gets a `Route` as its reply callable: it sends, and forgets the request once its last
reply has gone out, so the table only holds requests still owed an answer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tritond.wire.schema import InferReply


class Route:
    """The reply callable of one request; `done` once its last reply was sent."""
    __slots__ = ("table", "key", "send", "done")

    def __init__(self, table: dict, key: tuple[bytes, int], send: Callable[[InferReply], None]) -> None:
        self.table = table
        self.key = key
        self.send = send
        self.done = False

    def __call__(self, reply: InferReply) -> None:
        if not reply.more:
            self.done = True
            self.table.pop(self.key, None)
        self.send(reply)


class LiveRequests:
    def __init__(self) -> None:
        self.table: dict[tuple[bytes, int], Any] = {}

    def route(self, requester: bytes, rid: int, send: Callable[[InferReply], None]) -> Route:
        return Route(self.table, (requester, rid), send)

    def track(self, route: Route, handle: Any) -> None:
        """Remember what answers the request (a queued or executing request, an ensemble run)
        while it is still owed a reply."""
        if handle is not None and not route.done:
            self.table[route.key] = handle

    def get(self, requester: bytes, rid: int) -> Any:
        return self.table.get((requester, rid))

    def __len__(self) -> int:
        return len(self.table)
