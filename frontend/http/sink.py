"""A large binary infer request's body written into this frontend's shm arena as it arrives.

Through ASGI, every read is a new bytes object, the parser slices it, uvicorn grows a
bytearray with the slices and hands it out as bytes, the route joins the pieces and the
dataplane copies each tensor into the arena: five copies of every byte, most into fresh
multi-MiB allocations whose pages the kernel zero-fills. When a request's head declares a body
the route will take as it is (POST to an infer path, Content-Length between SINK_MIN and
--http-max-input-size, no Content-Encoding, a usable Inference-Header-Content-Length), the
protocol allocates one arena block of that size and copies what came with the head into it;
the socket reads the rest straight into the block (the transport is handed a buffered
protocol for as long, past the HTTP parser), so no byte of it is copied in this process. The
route then parses the JSON in place and hands the tensors after it to the broker where they
lie. The block is placed so that the binary part starts aligned for any element type.

The route owns the block once the body is complete (BodySink.take); until then the sink frees
it when the route or the connection ends without taking it. A head only declares a length, so
the blocks of bodies still arriving are capped per process (SinkBudget): clients that declare
large bodies and send nothing cannot take /dev/shm from every other request; beyond the cap,
bodies take the ASGI path, which holds only what arrived.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import httptools
from starlette.requests import ClientDisconnect

from tritond.shm.arena import ALIGN, Arena, Block
from tritond.wire.errors import TritonError

SINK_MIN = 64 * 1024    # smaller bodies come whole in one or two reads: the ASGI path is cheaper
SCOPE_KEY = "tritond.body_sink"
SCRATCH_BYTES = 256 * 1024     # what a read may drop at once of a body nobody waits for any more
BUDGET_BYTES = 256 << 20       # arena bytes one process's sinks may hold for bodies still arriving


class SinkBudget:
    """The arena bytes held by sinks whose body is still arriving, at most `limit`."""

    def __init__(self, limit: int = BUDGET_BYTES) -> None:
        self.limit = limit
        self.held = 0

    def take(self, nbytes: int) -> bool:
        if self.held + nbytes > self.limit:
            return False
        self.held += nbytes
        return True

    def give(self, nbytes: int) -> None:
        self.held -= nbytes


class BodySink:
    """An arena block the body's `size` bytes are written into, in arrival order; its bytes
    count against `budget` (already taken) until the body is in or the block is freed."""
    __slots__ = ("arena", "budget", "block", "view", "size", "filled", "base", "taken", "scratch")

    def __init__(self, arena: Arena, budget: SinkBudget, size: int, header_len: int) -> None:
        pad = -header_len % ALIGN
        self.arena = arena
        self.budget: SinkBudget | None = budget
        self.block: Block | None = arena.alloc(size + pad)
        self.view = self.block.view[pad:pad + size]
        self.size = size
        self.filled = 0
        self.base = self.block.offset + pad     # the body's first byte, as an offset in the segment
        self.taken = False
        self.scratch: bytearray | None = None

    @property
    def segment(self) -> str:
        return self.block.seg

    def write(self, data: bytes) -> None:
        """Copy `data`, body bytes the parser framed (never more than the body lacks); once the
        sink was released they are only counted."""
        end = self.filled + len(data)
        if self.block is not None:
            self.view[self.filled:end] = data
        self.filled = end
        if end == self.size:
            self._settle()

    def rest(self) -> memoryview:
        """Where the socket reads the next bytes of the body to: the block, or once it was
        released, a scratch buffer they are dropped in."""
        if self.block is not None:
            return self.view[self.filled:]
        if self.scratch is None:
            self.scratch = bytearray(SCRATCH_BYTES)
        return memoryview(self.scratch)[:self.size - self.filled]

    def advance(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == self.size:
            self._settle()

    def _settle(self) -> None:
        """The body is in, or its block freed: its bytes no longer count as waiting."""
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.give(self.size)

    @property
    def complete(self) -> bool:
        return self.filled == self.size

    def take(self) -> Block:
        """The block, now the caller's to free."""
        assert self.block is not None and self.complete
        self.taken = True
        return self.block

    def release(self) -> None:
        """Free the block unless it was taken; later writes are dropped."""
        block, self.block = self.block, None
        if block is not None and not self.taken:
            self.arena.free(block.seg, block.offset)
        self._settle()


def _declared(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The Inference-Header-Content-Length of an unencoded body, None when the route would
    not take the body as it is (an encoding to undo, no binary part, a value it refuses)."""
    header_len = None
    for name, value in headers:
        if name == b"inference-header-content-length":
            if header_len is None:          # the first of repeated fields wins, as in the route
                header_len = value
        elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return None
    if header_len is None or not header_len.isdigit():
        return None
    return int(header_len)


def sink_protocol(base: type, arena: Arena, is_infer: Callable[[str], object], limit: int) -> type:
    """`base` (the limited uvicorn protocol of limits.py, whose on_header notes the framing and
    the Content-Length) writing large binary infer bodies into `arena`."""

    headers_complete, on_body, message_complete = base.on_headers_complete, base.on_body, base.on_message_complete
    budget = SinkBudget()

    class Sinking(base):   # type: ignore[misc, valid-type]
        """Calls its base's parser callbacks directly (not through super()): they run for
        every request, most of which never open a sink."""
        _sink: BodySink | None = None

        def on_headers_complete(self) -> None:
            headers_complete(self)
            if self._framing == 2 and len(self._length) >= 5:
                self._open()

        def _open(self) -> None:
            cycle = self.cycle
            length = self._length
            if (cycle is None or cycle.scope is not self.scope or self.pipeline or not length.isdigit()
                    or self.scope["method"] != "POST"):
                return
            size = int(length)
            if not SINK_MIN <= size <= limit or not is_infer(self.scope["path"]):
                return
            header_len = _declared(self.headers)
            if header_len is None or header_len > size:
                return
            if not budget.take(size):
                return          # enough bodies are on their way: the route reads this one itself
            try:
                sink = BodySink(arena, budget, size, header_len)
            except TritonError:
                budget.give(size)
                return          # no shared memory to spare: the route reads the body itself
            self._sink = sink
            self.scope[SCOPE_KEY] = sink
            # the body bytes of the chunk being parsed still come through on_body; the
            # socket reads the rest into the sink
            self.transport.set_protocol(_BodyReader(self, sink))

        def on_body(self, body: bytes) -> None:
            sink = self._sink
            if sink is None:
                on_body(self, body)
            else:
                sink.write(body)

        def on_message_complete(self) -> None:
            if self._sink is not None:
                self._sink = None
                self.transport.set_protocol(self)
            message_complete(self)

        def end_body(self) -> None:
            """The body is in: the transport reads for this protocol again, with a new parser
            (the old one still counts the body's bytes it was never fed)."""
            self.parser = httptools.HttpRequestParser(self)
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
            self.on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._sink = None
            super().connection_lost(exc)

    return Sinking


class _BodyReader(asyncio.BufferedProtocol):
    """The transport's protocol while the rest of a sunk body arrives: the socket reads it into
    the sink; every other event goes to the HTTP protocol, which takes over again after."""

    def __init__(self, owner: Any, sink: BodySink) -> None:
        self.owner = owner
        self.sink = sink

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.sink.rest()

    def buffer_updated(self, nbytes: int) -> None:
        self.sink.advance(nbytes)
        if self.sink.complete:
            self.owner.end_body()

    def eof_received(self) -> bool | None:
        return self.owner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.owner.pause_writing()

    def resume_writing(self) -> None:
        self.owner.resume_writing()


async def until_complete(sink: BodySink, receive: Callable[[], Awaitable[dict]]) -> None:
    """Wait for the rest of the body through ASGI `receive` (which sends the 100 Continue a
    client asked for, and ends on the message the complete body brings); a disconnect before
    the body is complete raises ClientDisconnect."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if not message.get("more_body", False):
            break
    if not sink.complete:
        raise ClientDisconnect()
