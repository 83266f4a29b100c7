"""Reading a chunked Server-Sent-Events response as the streaming benchmarks time it: when each
chunk arrived and how many events it holds."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator


async def chunk_events(reader: asyncio.StreamReader, timeout_s: float) -> AsyncIterator[tuple[float, int]]:
    """After a response's status line: its headers skipped, then per chunk of the body its arrival
    time and its number of `data:` events (OpenAI's closing [DONE] not counted), to the last chunk."""
    async def line() -> bytes:
        return await asyncio.wait_for(reader.readline(), timeout_s)

    while (await line()) not in (b"\r\n", b""):
        pass
    while True:
        size = int((await line()).strip(), 16)
        chunk = await asyncio.wait_for(reader.readexactly(size + 2), timeout_s)
        if size == 0:
            return
        yield time.perf_counter(), chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
