"""Tool calls in a model's answer, in the formats of Triton's parsers (`--tool-call-parser`):
`llama3`: JSON objects `{"name": ..., "parameters"|"arguments": {...}}`, separated by "; ",
optionally after `<|python_tag|>`; `mistral`: `[TOOL_CALLS]` then a JSON list of
`{"name": ..., "arguments": {...}}`. An answer that does not parse as calls of the offered
tools (a name among them, with its arguments) is text.

A streamed answer is held back only while its beginning could still be a call; once it cannot,
it streams as text. A held answer is parsed when it ends.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Collection
from typing import Any

PARSERS = ("llama3", "mistral")
_MARKER = {"llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
_OPENS = {"llama3": "{", "mistral": "["}


def may_be_calls(parser: str, text: str) -> bool:
    """Whether an answer that begins with `text` could still turn out to be tool calls."""
    marker = _MARKER[parser]
    return marker.startswith(text) or text.startswith(marker) or text.startswith(_OPENS[parser])


def _call(raw: Any, names: Collection[str]) -> dict[str, Any]:
    """A call of an offered tool; ValueError otherwise (a JSON answer that happens to hold a "name")."""
    if not isinstance(raw, dict) or raw.get("name") not in names:
        raise ValueError("a tool call needs the name of an offered tool")
    if "arguments" not in raw and "parameters" not in raw:
        raise ValueError("a tool call needs its arguments")
    arguments = raw["arguments"] if "arguments" in raw else raw["parameters"]
    return {"id": f"call-{uuid.uuid4()}", "type": "function",
            "function": {"name": raw["name"], "arguments": json.dumps(arguments)}}


def parse(parser: str, text: str, names: Collection[str]) -> list[dict[str, Any]] | None:
    """The tool calls a complete answer makes of the tools named `names`, or None when it is text."""
    marker = _MARKER[parser]
    if not (text.startswith(marker) or text.startswith(_OPENS[parser])):
        return None
    body = text[len(marker):] if text.startswith(marker) else text
    try:
        if parser == "mistral":
            raw = json.loads(body.strip())
            return [_call(c, names) for c in (raw if isinstance(raw, list) else [raw])]
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(body):
            obj, end = decoder.raw_decode(body, at)
            calls.append(_call(obj, names))
            at = end
            while at < len(body) and body[at] in "; \n\t":
                at += 1
        return calls or None
    except ValueError:
        return None
