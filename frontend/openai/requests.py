"""From a validated OpenAI body to what is asked of the model: one `Generation`, or a clear 400
for what this server does not do (never a parameter silently dropped)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import client_error

# Sampling settings passed on to the model when the client sets them (None: not set).
SAMPLING = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed", "stop", "min_tokens",
            "ignore_eos")


@dataclass
class Generation:
    """One completion request: the prompt, how many choices, and the settings the model gets."""
    model: str
    prompt: str
    max_tokens: int
    max_tokens_given: bool = False      # the client set it (else it is --default-max-tokens)
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    echo: bool = False
    logprobs: int | None = None         # how many most likely tokens to report beside each one (None: no logprobs)
    tools: list[dict[str, Any]] | None = None   # chat: the tools the template offers the model
    tool_parser: str = ""               # chat: the format its answers' tool calls are parsed in ("": none)
    sampling: dict[str, Any] = field(default_factory=dict)   # what the client set, by OpenAI name


MAX_CHOICES = 16             # n: each choice is a model request of its own
MAX_PROMPT_CHARS = 1 << 20   # a prompt (a chat's as rendered) longer than any context a model here serves


def check_prompt(prompt: str) -> str:
    """`prompt`, unless it is longer than this server takes (400)."""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise client_error(f"the prompt is {len(prompt)} characters long; at most {MAX_PROMPT_CHARS} are taken")
    return prompt


# Integer fields, which the schema also takes as floats without a fraction (as pydantic does).
INTEGERS = ("n", "max_tokens", "max_completion_tokens", "min_tokens", "seed", "best_of", "logprobs", "top_logprobs")


def _integers(body: dict) -> dict:
    return {k: int(v) if k in INTEGERS and isinstance(v, float) else v for k, v in body.items()}


def _common(body: dict, default_max_tokens: int, max_tokens: int | None, logit_bias: str) -> dict[str, Any]:
    """The settings both routes take; `logit_bias`: the route's words refusing one."""
    if body.get("logit_bias") is not None:
        raise client_error(logit_bias)
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if options is not None and not stream:
        raise client_error("`stream_options` can only be used when `stream` is True")
    n = body.get("n") or 1
    if n > MAX_CHOICES:
        raise client_error(f"n={n}: at most {MAX_CHOICES} choices are generated for one request")
    sampling = {k: body[k] for k in SAMPLING if body.get(k) is not None}
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    if sampling.get("stop") == []:
        del sampling["stop"]
    return {"model": body["model"], "stream": stream, "n": n,
            "include_usage": bool(options and options.get("include_usage")),
            "max_tokens": default_max_tokens if max_tokens is None else max_tokens,
            "max_tokens_given": max_tokens is not None, "sampling": sampling}


def completion(body: dict, default_max_tokens: int) -> Generation:
    """POST /v1/completions: one prompt string."""
    body = _integers(body)
    if body.get("suffix") is not None:
        raise client_error("suffix is not currently supported")
    prompt = body["prompt"]
    if not prompt:
        raise client_error("prompt must be non-empty")
    if not isinstance(prompt, str):
        raise client_error("only single string input is supported")
    check_prompt(prompt)
    best_of = body.get("best_of")
    if best_of is not None and best_of > 1:
        raise client_error(f"Received best_of={best_of}, but only single choice (best_of=1) is currently supported")
    return Generation(prompt=prompt, echo=bool(body.get("echo")), logprobs=body.get("logprobs") or None,
                      **_common(body, default_max_tokens, body.get("max_tokens"), "logit bias is not supported"))


def chat(body: dict, default_max_tokens: int, tool_parser: str = "") -> tuple[Generation, list[dict[str, Any]]]:
    """POST /v1/chat/completions: the request (its prompt is filled in once the conversation is
    rendered by the chat template) and the conversation the template renders. Tools are offered
    to the model through the template and its answer parsed for calls in `tool_parser`'s format;
    forcing a call (`required`, a named tool) would need guided decoding and is refused."""
    body = _integers(body)
    top = body.get("top_logprobs")
    if top is not None and not body.get("logprobs"):
        raise client_error("`top_logprobs` can only be used when `logprobs` is True")
    tools, choice = body.get("tools") or None, body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise client_error("tool_choice 'required' or a named tool needs guided decoding, which this server does "
                           "not do; use 'auto'")
    if choice == "auto" and not tool_parser:
        raise client_error('"auto" tool choice requires --tool-call-parser to be set')
    if tools and choice is None and not tool_parser:
        raise client_error("having tools in the request requires --tool-call-parser to be set")
    if any(tool["function"].get("strict") for tool in tools or ()):
        raise client_error("strict function calling (a tool's 'strict': true) needs guided decoding, which this "
                           "server does not do")
    if body.get("parallel_tool_calls") is False:
        raise client_error("parallel_tool_calls=false is not supported by this server")
    if choice == "none":
        tools = None
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise client_error("functions and function_call are not supported by this server")
    fmt = body.get("response_format")
    if fmt is not None and fmt.get("type") != "text":
        raise client_error(f"response_format '{fmt.get('type')}' is not supported by this server")
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    logprobs = (1 if top is None else top) if body.get("logprobs") else None
    return (Generation(prompt="", logprobs=logprobs, tools=tools, tool_parser=tool_parser if tools else "",
                       **_common(body, default_max_tokens, limit, "logit bias is not currently supported")),
            conversation(body["messages"]))


def conversation(messages: list[dict]) -> list[dict[str, Any]]:
    """The messages as chat templates take them: text parts only, a tool call's arguments
    parsed into an object (what tool-use templates expect)."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
        if isinstance(msg["content"], list):
            for part in msg["content"]:
                if part["type"] != "text":
                    raise client_error(f"only text message is supported, but got {part['type']}")
                if not isinstance(part.get("text"), str):
                    raise client_error("a text part of a message needs its 'text'")
            msg["content"] = [{"type": "text", "text": p["text"]} for p in msg["content"]]
        if m.get("function_call") is not None:
            raise client_error("a message's function_call is not supported by this server; use tool_calls")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                try:
                    arguments = json.loads(call["function"]["arguments"])
                except (ValueError, RecursionError):     # nested too deep for the parser, too
                    raise client_error(f"the arguments of tool call '{call['id']}' are not JSON") from None
                calls.append({"id": call["id"], "type": "function",
                              "function": {"name": call["function"]["name"], "arguments": arguments}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out
