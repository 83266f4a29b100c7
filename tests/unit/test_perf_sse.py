"""The chunked Server-Sent-Events reader the streaming benchmarks share."""
from __future__ import annotations

import asyncio
from pathlib import Path

from tritond.perf.sse import chunk_events

PERF = Path(__file__).resolve().parents[2] / "perf"


def test_chunks_and_their_events():
    chunks = (b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n", b"data: [DONE]\n\n")
    body = (b"HTTP/1.1 200 OK\r\n", b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            *(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks), b"0\r\n\r\n")

    async def read() -> list[int]:
        reader = asyncio.StreamReader()
        for part in body:
            reader.feed_data(part)
        reader.feed_eof()
        await reader.readline()     # the status line is the caller's
        return [count async for _, count in chunk_events(reader, 5.0)]

    assert asyncio.run(read()) == [1, 2, 0]


def test_the_benchmarks_read_streams_through_it():
    for name in ("bench_openai.py", "bench_streaming.py"):
        text = (PERF / name).read_text()
        assert "chunk_events(" in text and "readexactly(size + 2)" not in text, name
