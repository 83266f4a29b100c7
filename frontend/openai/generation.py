"""Running one completion request on a model: its `n` choices as model requests side by side,
their responses as one stream of pieces, and the tally that gives each choice's text,
finish reason and the request's `usage`.

A decoupled model streams (a response per piece of text); any other model answers once. Leaving
the stream early (the client went away) cancels every choice's request in the model.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from tritond.wire import schema as S

from ..dataplane import Dataplane, InputTensor, RequestOptions
from .logprobs import Positions
from .mapping import Interface, answer, inputs
from .requests import Generation
from .tokenizer import Tokenizer

_END = object()


@dataclass
class Piece:
    """One model response of one choice."""
    index: int
    text: str
    final: bool                       # the choice's last
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    logprobs: Positions | None = None


async def model_pieces(dp: Dataplane, entry: S.ModelEntry, decoupled: bool, tensors: list[InputTensor], index: int,
                       request_id: str) -> AsyncIterator[Piece]:
    """The pieces of one model request: a decoupled model's responses as they come, else its one."""
    opts = RequestOptions(id=request_id)
    if not decoupled:
        result = await dp.infer(entry, tensors, [], opts)
        try:
            a = answer(result)
        finally:
            dp.release(result)
        yield Piece(index, a.text, True, a.prompt_tokens, a.output_tokens, a.logprobs)
        return
    async with aclosing(dp.infer_stream(entry, tensors, [], opts)) as replies:
        async for item in replies:
            if item.error is not None:
                raise item.error
            a = answer(item.result)       # read before the next reply releases this one's memory
            yield Piece(index, a.text, item.final, a.prompt_tokens, a.output_tokens, a.logprobs)


def _choice(dp: Dataplane, entry: S.ModelEntry, iface: Interface, gen: Generation, index: int,
            request_id: str) -> AsyncIterator[Piece]:
    seed = gen.sampling.get("seed")
    tensors = inputs(entry.name, iface, gen, None if seed is None else seed + index)
    return model_pieces(dp, entry, iface.decoupled, tensors, index, request_id)


async def pieces(dp: Dataplane, entry: S.ModelEntry, iface: Interface, gen: Generation,
                 request_id: str) -> AsyncIterator[Piece]:
    """Every choice's pieces, in the order they arrive. An error of any choice ends the stream
    (raised), and closing it early cancels what still runs."""
    if gen.n == 1:
        async with aclosing(_choice(dp, entry, iface, gen, 0, request_id)) as only:
            async for piece in only:
                yield piece
        return
    queue: asyncio.Queue = asyncio.Queue(maxsize=gen.n)

    async def pump(index: int) -> None:
        try:
            async with aclosing(_choice(dp, entry, iface, gen, index, request_id)) as choice:
                async for piece in choice:
                    await queue.put(piece)
            await queue.put(_END)
        except Exception as e:        # handed to the consumer, which raises it
            await queue.put(e)

    tasks = [asyncio.create_task(pump(i)) for i in range(gen.n)]
    try:
        running = gen.n
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Tally:
    """What the pieces add up to: each choice's text and token counts."""

    def __init__(self, n: int) -> None:
        self.texts = [""] * n
        self.prompt_tokens: int | None = None
        self.output_tokens: list[int | None] = [None] * n
        self.logprobs: list[Positions] = [[] for _ in range(n)]

    def add(self, piece: Piece) -> None:
        self.texts[piece.index] += piece.text
        if piece.logprobs:
            self.logprobs[piece.index] += piece.logprobs
        if self.prompt_tokens is None and piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.output_tokens is not None:
            self.output_tokens[piece.index] = (self.output_tokens[piece.index] or 0) + piece.output_tokens

    def finish_reason(self, index: int, max_tokens: int) -> str:
        """'length' when the model reports it generated `max_tokens` tokens, else 'stop'."""
        count = self.output_tokens[index]
        return "length" if count is not None and count >= max_tokens else "stop"

    def usage(self, prompt: str, chat: bool, tokenizer: Tokenizer | None) -> dict[str, Any] | None:
        """The model's own counts where it reports them, else the tokenizer's; None without either."""
        completion: int | None = None
        prompt_tokens = self.prompt_tokens
        if prompt_tokens is not None and None not in self.output_tokens:
            completion = sum(c or 0 for c in self.output_tokens)
        elif tokenizer is not None and tokenizer.encoder is not None:
            prompt_tokens = tokenizer.count(prompt, special_tokens=not chat)
            completion = sum(tokenizer.count(t, special_tokens=False) or 0 for t in self.texts)
        if prompt_tokens is None or completion is None:
            return None
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion}
