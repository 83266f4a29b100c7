"""Cancelling an HTTP inference when its client goes away.

uvicorn (and hypercorn) do not cancel a handler whose client disconnected; the disconnect only
shows in the ASGI `receive` channel. A request still unanswered after WATCH_AFTER_S starts
watching that channel; a disconnect then cancels the inference, which tells the broker (a queued
request is taken out, an executing one sees `request.is_cancelled()` in the model).

A request only registers itself (no timer of its own): one sweep per event loop, every
WATCH_AFTER_S while requests wait, starts the watch of those that waited that long.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect

# A request still unanswered this long starts watching for its client's disconnect (which
# cancels it); quicker ones never pay for the watch.
WATCH_AFTER_S = 0.05

Receive = Callable[[], Awaitable[dict]]


class _Watch:
    """A request's read of `receive` once it waited: a disconnect cancels its task."""
    __slots__ = ("task", "reader", "gone")

    def __init__(self, task: asyncio.Task, receive: Receive) -> None:
        self.task = task
        self.gone = False
        self.reader = asyncio.ensure_future(receive())
        self.reader.add_done_callback(self.on_message)

    def on_message(self, f: asyncio.Future) -> None:
        if not f.cancelled() and f.exception() is None and f.result().get("type") == "http.disconnect":
            self.gone = True
            self.task.cancel()


class _Sweep:
    """The waiting requests of one event loop, and the timer that starts their watches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[asyncio.Task, tuple[float, Receive]] = {}    # task -> (since, receive)
        self.watching: dict[asyncio.Task, _Watch] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task, receive: Receive) -> None:
        self.waiting[task] = (self.loop.time(), receive)
        if self.timer is None:
            self.timer = self.loop.call_later(WATCH_AFTER_S, self.sweep)

    def sweep(self) -> None:
        self.timer = None
        due = self.loop.time() - WATCH_AFTER_S
        waiting = self.waiting
        started = [task for task, (since, _) in waiting.items() if since <= due]
        for task in started:
            _, receive = waiting.pop(task)
            self.watching[task] = _Watch(task, receive)
        if waiting:
            oldest = min(since for since, _ in waiting.values())
            self.timer = self.loop.call_at(oldest + WATCH_AFTER_S, self.sweep)


_sweep: _Sweep | None = None


async def until_disconnect(receive: Receive, work: Any) -> Any:
    """Await `work` (an inference); if the client disconnects first (its ASGI `receive` says
    so), the work is cancelled (the broker takes a queued request out, an executing one sees
    `is_cancelled()`) and ClientDisconnect is raised."""
    global _sweep
    task = asyncio.current_task()
    loop = task.get_loop()
    sweep = _sweep
    if sweep is None or sweep.loop is not loop:
        sweep = _sweep = _Sweep(loop)
    sweep.add(task, receive)
    try:
        return await work
    except asyncio.CancelledError:
        watch = sweep.watching.get(task)
        if watch is None or not watch.gone:
            raise
        task.uncancel()
        raise ClientDisconnect() from None
    finally:
        if sweep.waiting.pop(task, None) is None:
            watch = sweep.watching.pop(task, None)
            if watch is not None:
                watch.reader.cancel()
