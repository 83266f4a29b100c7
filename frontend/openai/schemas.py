"""The request bodies of the OpenAI routes, as Triton's frontend's schema takes them: every field
it accepts, with its type and range; any other field is refused (422)."""
from __future__ import annotations

from .validation import (Check, Field, anything, boolean, either, integer, list_of, literal, mapping, number, obj,
                         string)

INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_MESSAGES = 2048      # of a chat request (OpenAI's own limit)

_stop = either(("str", string), ("list[str]", list_of(string)))
_stream_options = obj({"include_usage": Field(boolean)})

# Fields both completion routes take.
_COMMON = {
    "model": Field(string, required=True, nullable=False),
    "frequency_penalty": Field(number(-2.0, 2.0)),
    "presence_penalty": Field(number(-2.0, 2.0)),
    "ignore_eos": Field(boolean),
    "logit_bias": Field(mapping),
    "max_tokens": Field(integer(ge=0)),
    "min_tokens": Field(integer(ge=0)),
    "n": Field(integer(1, 128)),
    "seed": Field(integer(*INT64)),
    "stop": Field(_stop),
    "stream": Field(boolean),
    "stream_options": Field(_stream_options),
    "temperature": Field(number(0.0, 2.0)),
    "top_p": Field(number(0.0, 1.0)),
    "user": Field(string),
}

COMPLETION: Check = obj({
    **_COMMON,
    "prompt": Field(either(("str", string), ("list[str]", list_of(string)), ("list[int]", list_of(integer())),
                           ("list[PromptItem]", list_of(list_of(anything)))), required=True, nullable=False),
    "best_of": Field(integer(0, 20)),
    "echo": Field(boolean),
    "logprobs": Field(integer(0, 5)),
    "suffix": Field(string),
})

_text_part = obj({"type": Field(string, required=True, nullable=False), "text": Field(string)}, extra=True)
_content = either(("str", string), ("list[ChatCompletionRequestMessageContentPart]", list_of(_text_part)))
_function_call = obj({"name": Field(string, required=True, nullable=False),
                      "arguments": Field(string, required=True, nullable=False)})
_tool_call = obj({"id": Field(string, required=True, nullable=False),
                  "type": Field(literal("function"), required=True, nullable=False),
                  "function": Field(_function_call, required=True, nullable=False)})
MESSAGE_FIELDS = {
    "role": Field(literal("system", "user", "assistant", "tool", "function"), required=True, nullable=False),
    "content": Field(_content, required=True),
    "name": Field(string),
    "tool_calls": Field(list_of(_tool_call)),
    "tool_call_id": Field(string),
    "function_call": Field(_function_call),
}
# What an assistant message answered by this server holds besides (clients send it back as
# history): null values only, refused otherwise.
ECHOED_NULLS = ("refusal", "audio", "annotations", "reasoning_content")


_message_fields = obj(MESSAGE_FIELDS)


def _message(v, loc):
    """A message; an assistant's may leave out its content (it made tool calls)."""
    if isinstance(v, dict):
        v = {k: x for k, x in v.items() if not (k in ECHOED_NULLS and x is None)}
        if v.get("role") == "assistant":
            v.setdefault("content", None)
    return _message_fields(v, loc)


_function = obj({"name": Field(string, required=True, nullable=False), "description": Field(string),
                 "parameters": Field(mapping), "strict": Field(boolean)})
_tool = obj({"type": Field(literal("function"), required=True, nullable=False),
             "function": Field(_function, required=True, nullable=False)})
_tool_choice = either(("ChatCompletionToolChoiceOption1", literal("none", "auto", "required")),
                      ("ChatCompletionNamedToolChoice", obj({"type": Field(literal("function"), required=True),
                                                             "function": Field(obj({"name": Field(string,
                                                                                                   required=True)}),
                                                                               required=True)})))

CHAT: Check = obj({
    **_COMMON,
    "messages": Field(list_of(_message, min_length=1, max_length=MAX_MESSAGES), required=True, nullable=False),
    "logprobs": Field(boolean),
    "top_logprobs": Field(integer(0, 20)),
    "max_completion_tokens": Field(integer(ge=0)),
    "response_format": Field(obj({"type": Field(literal("text", "json_object", "json_schema"), required=True),
                                  "json_schema": Field(mapping)})),
    "tools": Field(list_of(_tool)),
    "tool_choice": Field(_tool_choice),
    "parallel_tool_calls": Field(boolean),
    "function_call": Field(anything),
    "functions": Field(list_of(anything)),
})

EMBEDDING: Check = obj({
    "model": Field(string, required=True, nullable=False),
    "input": Field(either(("str", string), ("list[int]", list_of(integer(), 1))), required=True, nullable=False),
    "dimensions": Field(integer(ge=1)),
    "encoding_format": Field(literal("float", "base64")),
    "user": Field(string),
})
