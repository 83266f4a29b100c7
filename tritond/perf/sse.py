"""Streaming clients as the streaming benchmarks time them: a closed loop of requests on one
keep-alive connection, and each chunked Server-Sent-Events response read as when each chunk
arrived and how many events it holds."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable


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


async def closed_loop(host: str, port: int, request: Callable[[int], bytes], seed: int, until: float,
                      timeout_s: float) -> AsyncIterator[tuple[int, float, AsyncIterator[tuple[float, int]]]]:
    """On one keep-alive connection, request i (seed + 1, seed + 2, ...) sent until `until`, each
    after the last one's events were read: (i, when it was sent, its chunk_events). A status other
    than 200 raises ConnectionError naming the request."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        i = seed
        while time.perf_counter() < until:
            i += 1
            writer.write(request(i))
            sent = time.perf_counter()
            status = await asyncio.wait_for(reader.readline(), timeout_s)
            if b" 200 " not in status:
                raise ConnectionError(f"request {i} answered {status.decode(errors='replace').strip()!r}")
            yield i, sent, chunk_events(reader, timeout_s)
    finally:
        writer.close()
