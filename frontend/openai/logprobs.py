"""Log-probabilities as the OpenAI API gives them, from a model's `logprobs` output in vLLM's form:
a JSON list with, per generated token, `{token id: {"logprob", "rank", "decoded_token"}}`: the
token chosen first (its rank is 1 only when it was the most likely), then the most likely ones."""
from __future__ import annotations

import json
import sys
from typing import Any

Positions = list[dict[str, dict[str, Any]]]


def parse(text: str) -> Positions | None:
    """The positions of one response's `logprobs` output (None when it says none)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, list) else None


def _ranked(position: dict[str, dict[str, Any]]) -> tuple[tuple[str, float], list[tuple[str, float]]]:
    """The chosen token's (token, logprob), and every listed token's by rank."""
    def pair(d: dict[str, Any]) -> tuple[str, float]:
        return str(d.get("decoded_token", "")), float(d.get("logprob", 0.0))
    entries = list(position.values())
    return pair(entries[0]), [pair(d) for d in sorted(entries, key=lambda d: d.get("rank", sys.maxsize))]


def for_chat(positions: Positions) -> dict[str, Any]:
    """A chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    content = []
    for position in positions:
        if not position:
            continue
        (token, logprob), ranked = _ranked(position)
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()),
                        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked]})
    return {"content": content}


def for_completion(positions: Positions, offset: int = 0) -> dict[str, Any]:
    """A completion choice's `logprobs`: parallel lists, `text_offset` counted from `offset`."""
    out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for position in positions:
        if not position:
            continue
        (token, logprob), ranked = _ranked(position)
        out["text_offset"].append(offset)
        out["token_logprobs"].append(logprob)
        out["tokens"].append(token)
        out["top_logprobs"].append(dict(ranked))
        offset += len(token)
    return out
