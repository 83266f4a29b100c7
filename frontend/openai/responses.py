"""The OpenAI response bodies and Server-Sent Events, shaped as Triton's frontend writes them."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from tritond.wire.errors import TritonError

from ..errors import http_status
from .errors import ApiError
from .generation import Piece, Tally
from .logprobs import Positions, for_chat, for_completion
from .requests import Generation
from .tool_calls import may_be_calls, parse as parse_calls
from .tokenizer import Tokenizer

DONE = b"data: [DONE]\n\n"
OWNED_BY = "Triton Inference Server"


def event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "created": created, "object": "model", "owned_by": OWNED_BY}


@dataclass
class Reply:
    """Who answers: the request's id, time and model, and whether it is a chat."""
    id: str
    created: int
    gen: Generation
    chat: bool
    tokenizer: Tokenizer | None

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.gen.model, "system_fingerprint": None,
                "object": obj}

    def body(self, tally: Tally) -> dict[str, Any]:
        """The whole answer of a request that did not stream."""
        choices = []
        for i, text in enumerate(tally.texts):
            reason = tally.finish_reason(i, self.gen.max_tokens)
            logprobs = self.logprobs(tally.logprobs[i], self.echoed)
            if self.chat:
                calls = parse_calls(self.gen.tool_parser, text, self.tool_names) if self.gen.tool_parser else None
                choices.append({"index": i, "message": {"content": "" if calls else text, "role": "assistant",
                                                        "tool_calls": calls},
                                "logprobs": logprobs, "finish_reason": "tool_calls" if calls else reason})
            else:
                choices.append({"finish_reason": reason, "index": i, "logprobs": logprobs,
                                "text": (self.gen.prompt + text) if self.gen.echo else text})
        return {**self.head(self.object), "choices": choices,
                "usage": tally.usage(self.gen.prompt, self.chat, self.tokenizer)}

    @property
    def tool_names(self) -> set[str]:
        """The names of the tools the request offers: what a tool call may name."""
        return {tool["function"]["name"] for tool in self.gen.tools or ()}

    @property
    def echoed(self) -> int:
        """Where the generated text starts in a choice's text."""
        return len(self.gen.prompt) if self.gen.echo else 0

    def logprobs(self, positions: Positions, offset: int) -> dict[str, Any] | None:
        if self.gen.logprobs is None:
            return None
        return for_chat(positions) if self.chat else for_completion(positions, offset)

    def chunk(self, index: int, text: str, reason: str | None, role: bool = False,
              logprobs: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else {"content": text}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            return event({**self.head("chat.completion.chunk"), "choices": [choice]})
        choice = {"finish_reason": reason, "index": index, "logprobs": logprobs, "text": text}
        return event({**self.head("text_completion"), "choices": [choice]})

    def calls_chunk(self, index: int, calls: list[dict[str, Any]]) -> bytes:
        delta = {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": "tool_calls"}
        return event({**self.head("chat.completion.chunk"), "choices": [choice]})

    async def events(self, first: Piece, rest: AsyncIterator[Piece]) -> AsyncIterator[bytes]:
        """The stream: (chat) each choice's role, each piece as it comes with the choice's finish
        reason on its last, the usage when asked, then [DONE]. An error after the stream began
        comes as an event of its own `{"error": {...}}` (which OpenAI clients raise), ending it.
        With a tool-call parser a choice's text is held back while it could be tool calls; held
        to its end, it goes out as the calls it makes (or as text)."""
        gen = self.gen
        tally = Tally(gen.n)
        if self.chat:
            for i in range(gen.n):
                yield self.chunk(i, "", None, role=True)
        started = [False] * gen.n
        parser = gen.tool_parser
        held = [""] * gen.n
        held_positions: list[Positions] = [[] for _ in range(gen.n)]    # the logprobs of the held text
        holding = [bool(parser)] * gen.n
        piece: Piece | None = first
        try:
            while piece is not None:
                offset = self.echoed + len(tally.texts[piece.index])
                tally.add(piece)
                logprobs = self.logprobs(piece.logprobs or [], offset)
                text = piece.text
                if gen.echo and not started[piece.index]:
                    text = gen.prompt + text
                started[piece.index] = True
                reason = tally.finish_reason(piece.index, gen.max_tokens) if piece.final else None
                i = piece.index
                if holding[i]:
                    held[i] += text
                    held_positions[i] += piece.logprobs or []
                    calls = parse_calls(parser, held[i], self.tool_names) if piece.final else None
                    if calls:
                        yield self.calls_chunk(i, calls)
                    elif piece.final or not may_be_calls(parser, held[i]):
                        holding[i] = False
                        yield self.chunk(i, held[i], reason, logprobs=self.logprobs(held_positions[i], self.echoed))
                else:
                    yield self.chunk(i, text, reason, logprobs=logprobs)
                piece = await anext(rest, None)
        except (TritonError, ApiError) as e:
            status = e.status if isinstance(e, ApiError) else http_status(e)
            yield event({"error": {"message": e.message, "type": "invalid_request_error" if status < 500
                                   else "server_error", "code": status}})
            return
        finally:
            await rest.aclose()
        if gen.include_usage:
            usage = await asyncio.to_thread(tally.usage, gen.prompt, self.chat, self.tokenizer)   # counts tokens
            yield event({**self.head(f"{self.object}.chunk" if self.chat else "text_completion"),
                         "choices": [], "usage": usage})
        yield DONE
