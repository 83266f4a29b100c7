"""The chunked Server-Sent-Events reader and the closed-loop client the streaming benchmarks share."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tritond.perf.sse import chunk_events, closed_loop

PERF = Path(__file__).resolve().parents[2] / "perf"


CHUNKS = (b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n", b"data: [DONE]\n\n")
HEAD = b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENTS = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in CHUNKS) + b"0\r\n\r\n"


def test_chunks_and_their_events():
    body = (b"HTTP/1.1 200 OK\r\n", HEAD, EVENTS)

    async def read() -> list[int]:
        reader = asyncio.StreamReader()
        for part in body:
            reader.feed_data(part)
        reader.feed_eof()
        await reader.readline()     # the status line is the caller's
        return [count async for _, count in chunk_events(reader, 5.0)]

    assert asyncio.run(read()) == [1, 2, 0]


def test_a_closed_loop_sends_the_next_request_after_the_last_stream_ended():
    """Two streamed answers on one connection, then a 503 that ends the loop naming its request."""
    async def run() -> tuple[list[tuple[int, list[int]]], str]:
        answers = [b"HTTP/1.1 200 OK\r\n" + HEAD + EVENTS] * 2 + [b"HTTP/1.1 503 Unavailable\r\n\r\n"]
        received: list[bytes] = []

        async def serve(reader, writer):
            for answer in answers:
                received.append(await reader.readline())
                writer.write(answer)
                await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        seen = []
        try:
            async for i, _, events in closed_loop("127.0.0.1", port, lambda i: b"GET /%d\n" % i, 10,
                                                  time.perf_counter() + 30, 5.0):
                seen.append((i, [count async for _, count in events]))
        except ConnectionError as e:
            error = str(e)
        server.close()
        assert received == [b"GET /11\n", b"GET /12\n", b"GET /13\n"]
        return seen, error

    seen, error = asyncio.run(run())
    assert seen == [(11, [1, 2, 0]), (12, [1, 2, 0])]
    assert "request 13" in error and "503" in error


def test_the_benchmarks_read_streams_through_it():
    for name in ("bench_openai.py", "bench_streaming.py"):
        text = (PERF / name).read_text()
        assert "closed_loop(" in text and "readexactly(size + 2)" not in text and "open_connection" not in text, name
