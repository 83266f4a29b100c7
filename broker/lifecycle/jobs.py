"""Work the broker's loop must not wait for: reading a model's config and files, scanning the
repository, mirroring a remote model. A job runs on a small thread pool (--model-load-thread-count)
and its completion is handed back to the loop, which polls `fd` and runs the callbacks in its
own thread, so broker state is only ever touched by the loop. The in-process harness uses
`InlineJobs`, which runs each job and its callback at once.
"""
from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("tritond.broker")

Done = Callable[[Future], None]


class Jobs:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="load")
        self._done: collections.deque[tuple[Future, Done]] = collections.deque()
        self.fd, self._wake = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wake, False)

    def submit(self, fn: Callable[[], Any], done: Done) -> None:
        fut = self._pool.submit(fn)
        fut.add_done_callback(lambda f: self._finished(f, done))

    def _finished(self, fut: Future, done: Done) -> None:
        self._done.append((fut, done))
        try:
            os.write(self._wake, b"j")
        except BlockingIOError:
            pass            # the loop has plenty of wake-ups pending already

    def collect(self) -> None:
        """Run the callbacks of finished jobs (in the loop's thread)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass
        while self._done:
            fut, done = self._done.popleft()
            done(fut)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        os.close(self.fd)
        os.close(self._wake)


class InlineJobs(Jobs):
    """Jobs run synchronously when submitted, and so do their callbacks (the in-process harness)."""

    def __init__(self) -> None:
        self.fd = -1

    def submit(self, fn: Callable[[], Any], done: Done) -> None:
        fut: Future = Future()
        try:
            fut.set_result(fn())
        except Exception as e:       # delivered to the callback, as a pool would
            fut.set_exception(e)
        done(fut)

    def collect(self) -> None:
        pass

    def close(self) -> None:
        pass
