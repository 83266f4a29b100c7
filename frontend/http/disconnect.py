"""Cancelling an HTTP inference when its client goes away.

uvicorn (and hypercorn) do not cancel a handler whose client disconnected; the disconnect only
shows in the ASGI `receive` channel. A request still unanswered after WATCH_AFTER_S starts
watching that channel; a disconnect then cancels the inference, which tells the broker (a queued
request is taken out, an executing one sees `request.is_cancelled()` in the model).
"""
from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import ClientDisconnect, Request

# A request still unanswered this long starts watching for its client's disconnect (which
# cancels it); quicker ones never pay for the watch.
WATCH_AFTER_S = 0.05


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await `work` (an inference); if the client disconnects first, the work is cancelled (the
    broker takes a queued request out, an executing one sees `is_cancelled()`) and
    ClientDisconnect is raised."""
    task = asyncio.current_task()
    gone: list[bool] = []
    watcher: list[asyncio.Future] = []

    def on_message(f: asyncio.Future) -> None:
        if not f.cancelled() and f.exception() is None and f.result().get("type") == "http.disconnect":
            gone.append(True)
            task.cancel()

    def watch() -> None:
        w = asyncio.ensure_future(request.receive())
        w.add_done_callback(on_message)
        watcher.append(w)

    handle = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientDisconnect() from None
    finally:
        handle.cancel()
        for w in watcher:
            w.cancel()
