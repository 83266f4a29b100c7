"""Tool calls in a model's answer, in the formats of Triton's parsers (`--tool-call-parser`):
`llama3`: JSON objects `{"name": ..., "parameters"|"arguments": {...}}`, separated by "; ",
optionally after `<|python_tag|>`; `mistral`: `[TOOL_CALLS]` then a JSON list of
`{"name": ..., "arguments": {...}}`. An answer that does not parse as calls is text.

A streamed answer is held back only while its beginning could still be a call; once it cannot,
it streams as text. A held answer is parsed when it ends.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

PARSERS = ("llama3", "mistral")
_MARKER = {"llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
_OPENS = {"llama3": "{", "mistral": "["}


def may_be_calls(parser: str, text: str) -> bool:
    """Whether an answer that begins with `text` could still turn out to be tool calls."""
    marker = _MARKER[parser]
    return marker.startswith(text) or text.startswith(marker) or text.startswith(_OPENS[parser])


def _call(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError("a tool call needs a name")
    arguments = raw["arguments"] if "arguments" in raw else raw.get("parameters", {})
    return {"id": f"call-{uuid.uuid4()}", "type": "function",
            "function": {"name": raw["name"], "arguments": json.dumps(arguments)}}


def parse(parser: str, text: str) -> list[dict[str, Any]] | None:
    """The tool calls a complete answer makes, or None when it is text."""
    marker = _MARKER[parser]
    if not (text.startswith(marker) or text.startswith(_OPENS[parser])):
        return None
    body = text[len(marker):] if text.startswith(marker) else text
    try:
        if parser == "mistral":
            raw = json.loads(body.strip())
            return [_call(c) for c in (raw if isinstance(raw, list) else [raw])]
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            obj, end = decoder.raw_decode(body, at)
            calls.append(_call(obj))
            at = end
            while at < len(body) and body[at] in "; \n\t":
                at += 1
        return calls or None
    except ValueError:
        return None
