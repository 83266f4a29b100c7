"""Reading a request body from the ASGI channel: decompressed, never more than
--http-max-input-size bytes, with Triton's wording for each refusal."""
from __future__ import annotations

import zlib
from typing import Awaitable, Callable

from starlette.requests import ClientDisconnect

from tritond.wire.errors import Code, TritonError, invalid

ENCODINGS = ("", "identity", "gzip", "deflate")
_HINT = "Use --http-max-input-size to increase the limit."


class UnsupportedEncoding(TritonError):
    """A Content-Encoding other than gzip/deflate/identity; the reply names the ones accepted."""

    def __init__(self) -> None:
        super().__init__(Code.UNSUPPORTED, "Unsupported compression type")


def too_large(size: int, limit: int, infer: bool, header_length: str | None) -> TritonError:
    """Triton's wording for an oversized body depends on what the body holds: `infer` for the
    infer route, `header_length` its Inference-Header-Content-Length."""
    if not infer or header_length is None:
        return invalid(f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} "
                       f"bytes. {_HINT}")
    if header_length.strip() == "0":
        return invalid(f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
                       f"{limit} bytes. {_HINT}")
    return invalid(f"request size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {_HINT}")


async def read_body(receive: Callable[[], Awaitable[dict]], encoding: str, declared: str | bytes | None,
                    limit: int, infer: bool = False, header_length: str | None = None) -> bytes | bytearray:
    """The body `receive` delivers, decompressed per `encoding` (the Content-Encoding header,
    stripped and lowercased); `declared` is the Content-Length header (text or its raw bytes).
    A disconnect before the body is complete raises ClientDisconnect."""
    _check_head(encoding, declared, limit, infer, header_length)
    first: bytes = b""
    grown: bytearray | None = None     # a body of several chunks grows in place (no 2x join)
    total = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise too_large(total, limit, infer, header_length)
                if grown is not None:
                    grown += chunk
                elif first:
                    grown = bytearray(first)
                    grown += chunk
                else:
                    first = chunk
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientDisconnect()
    return _decoded(first if grown is None else grown, encoding, limit)


def held_body(body: bytes | bytearray, encoding: str, declared: str | bytes | None, limit: int,
              infer: bool = False, header_length: str | None = None) -> bytes | bytearray:
    """A body the server had already read whole before the handler ran, checked and decompressed
    as read_body does it (no ASGI message is made for it)."""
    _check_head(encoding, declared, limit, infer, header_length)
    if len(body) > limit:
        raise too_large(len(body), limit, infer, header_length)
    return _decoded(body, encoding, limit)


def _check_head(encoding: str, declared: str | bytes | None, limit: int, infer: bool,
                header_length: str | None) -> None:
    if encoding not in ENCODINGS:
        raise UnsupportedEncoding()
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit, infer, header_length)


def _decoded(body: bytes | bytearray, encoding: str, limit: int) -> bytes | bytearray:
    if encoding == "" or encoding == "identity":
        return body
    if not body:
        raise invalid("nothing to be decompressed")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise invalid(f"failed to decompress the request body: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise invalid(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
                      f"Use --http-max-input-size to increase the limit.")
    if not d.eof:
        raise invalid("failed to decompress the request body: the compressed stream is truncated")
    return out
