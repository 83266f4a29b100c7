"""OpenAI request bodies: the schema's 422 errors in pydantic's words (what Triton's frontend
answers), and the 400s for what this server does not do."""
import json

import pytest

from tritond.frontend.openai import requests
from tritond.frontend.openai.errors import ApiError
from tritond.frontend.openai.schemas import CHAT, COMPLETION, EMBEDDING
from tritond.frontend.openai.validation import ValidationFailed, validate

MESSAGES = [{"role": "user", "content": "hi"}]


def errors(check, body):
    with pytest.raises(ValidationFailed) as info:
        validate(check, body)
    return info.value.errors


def refusal(fn, body):
    with pytest.raises(ApiError) as info:
        fn(body, 16)
    assert info.value.status == 400
    return info.value.message


def test_valid_bodies_pass():
    validate(COMPLETION, {"model": "m", "prompt": "p", "max_tokens": 3, "temperature": 0, "stop": ["."], "n": 2,
                          "seed": -5, "stream": True, "stream_options": {"include_usage": True}, "user": None})
    validate(CHAT, {"model": "m", "messages": [{"role": "system", "content": "s"},
                                               {"role": "user", "content": [{"type": "text", "text": "t"}]},
                                               {"role": "assistant", "content": None, "refusal": None}],
                    "max_completion_tokens": 4, "top_p": 0.5})
    validate(EMBEDDING, {"model": "m", "input": [1, 2], "encoding_format": "base64", "dimensions": 4})
    validate(EMBEDDING, {"model": "m", "input": "text"})


@pytest.mark.parametrize("key, value, kind, msg", [
    ("temperature", 2.1, "less_than_equal", "Input should be less than or equal to 2"),
    ("temperature", -0.1, "greater_than_equal", "Input should be greater than or equal to 0"),
    ("max_tokens", -1, "greater_than_equal", "Input should be greater than or equal to 0"),
    ("top_p", 1.1, "less_than_equal", "Input should be less than or equal to 1"),
    ("frequency_penalty", 3, "less_than_equal", "Input should be less than or equal to 2"),
    ("n", 0, "greater_than_equal", "Input should be greater than or equal to 1"),
    ("n", 1.5, "int_from_float", "Input should be a valid integer, got a number with a fractional part"),
    ("ignore_eos", 123, "bool_parsing", "Input should be a valid boolean, unable to interpret input"),
    ("top_logprobs", 25, "less_than_equal", "Input should be less than or equal to 20"),
    ("bogus", 1, "extra_forbidden", "Extra inputs are not permitted"),
])
def test_out_of_schema_values_are_422_with_pydantic_words(key, value, kind, msg):
    (e, *_) = errors(CHAT, {"model": "m", "messages": MESSAGES, key: value})
    assert (e["type"], e["msg"], e["loc"]) == (kind, msg, ["body", key])


def test_messages_errors():
    assert errors(CHAT, {"model": "m", "messages": []})[0]["msg"] == \
        "List should have at least 1 item after validation, not 0"
    assert errors(CHAT, {"model": "m", "messages": [{}]})[0]["msg"] == "Field required"
    assert errors(CHAT, {"messages": MESSAGES})[0]["loc"] == ["body", "model"]
    assert errors(CHAT, {"model": "m", "messages": [{"role": "robot", "content": "x"}]})[0]["type"] == "literal_error"
    assert errors(CHAT, {"model": "m", "messages": [{"role": "user", "content": "x", "refusal": "no"}]})[0][
        "type"] == "extra_forbidden"
    assert errors(COMPLETION, {"model": "m"})[0]["msg"] == "Field required"
    assert errors(COMPLETION, {"model": "m", "prompt": "p", "stop": 5})[0]["loc"] == ["body", "stop", "str"]
    assert errors(COMPLETION, [1])[0]["type"] == "model_attributes_type"
    assert [e["loc"] for e in errors(EMBEDDING, {"model": "m", "input": ["a"]})] == [
        ["body", "input", "str"], ["body", "input", "list[int]", 0]]
    assert errors(EMBEDDING, {"model": "m", "input": "a", "encoding_format": "hex"})[0]["msg"] == \
        "Input should be 'float' or 'base64'"


def test_a_body_full_of_mistakes_answers_a_small_422():
    import orjson
    found = errors(CHAT, {"model": "m", "messages": [{"x": 1}] * 2000})
    assert len(found) == 10 and all("input" not in e for e in found if e["type"] == "missing")
    found = errors(CHAT, {"model": "m", "messages": [{"x": 1}] * 131_072})
    assert [(e["type"], e["loc"]) for e in found] == [("too_long", ["body", "messages"])]
    assert found[0]["msg"] == "List should have at most 2048 items after validation, not 131072"
    assert len(orjson.dumps(found)) < 1000
    found = errors(CHAT, {"model": "m", "messages": MESSAGES, "user": ["x" * 100_000] * 100, **{
        f"k{i}": "y" * 100_000 for i in range(50)}})
    assert len(found) == 10 and len(orjson.dumps(found)) < 5000


@pytest.mark.parametrize("body, text", [
    ({"prompt": "p" * ((1 << 20) + 1)}, "at most 1048576 are taken"),
    ({"prompt": "p", "n": 17}, "n=17: at most 16 choices are generated for one request"),
])
def test_what_is_too_large_for_this_server(body, text):
    assert text in refusal(requests.completion, {"model": "m", **body})


def test_completion_request():
    gen = requests.completion({"model": "m", "prompt": "p", "stop": ".", "temperature": 0, "seed": 3, "n": 2,
                               "echo": True, "user": "u", "stream": True, "stream_options": {"include_usage": True}},
                              16)
    assert (gen.model, gen.prompt, gen.n, gen.echo, gen.stream, gen.include_usage) == ("m", "p", 2, True, True, True)
    assert gen.sampling == {"stop": ["."], "temperature": 0, "seed": 3}
    assert (gen.max_tokens, gen.max_tokens_given) == (16, False)
    assert requests.completion({"model": "m", "prompt": "p", "max_tokens": 0}, 16).max_tokens == 0
    assert requests.completion({"model": "m", "prompt": "p", "logprobs": 2}, 16).logprobs == 2
    assert requests.completion({"model": "m", "prompt": "p", "logprobs": 0}, 16).logprobs is None
    gen = requests.completion({"model": "m", "prompt": "p", "max_tokens": 4.0, "n": 2.0, "seed": 1.0}, 16)
    assert (gen.max_tokens, gen.n, gen.sampling["seed"]) == (4, 2, 1) and type(gen.n) is int


@pytest.mark.parametrize("body, text", [
    ({"prompt": ""}, "prompt must be non-empty"),
    ({"prompt": ["a", "b"]}, "only single string input is supported"),
    ({"suffix": "x"}, "suffix is not currently supported"),
    ({"logit_bias": {"1": 2}}, "logit bias is not supported"),
    ({"best_of": 2}, "Received best_of=2, but only single choice (best_of=1) is currently supported"),
    ({"stream_options": {"include_usage": True}}, "`stream_options` can only be used when `stream` is True"),
])
def test_completion_refusals(body, text):
    assert text in refusal(requests.completion, {"model": "m", "prompt": "p", **body})


def test_chat_request():
    gen, conversation = requests.chat({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"}], "max_tokens": 5, "max_completion_tokens": 7}, 16)
    assert (gen.max_tokens, gen.max_tokens_given, gen.logprobs) == (7, True, None)
    assert requests.chat({"model": "m", "messages": MESSAGES, "logprobs": True}, 16)[0].logprobs == 1
    assert requests.chat({"model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 0}, 16)[0].logprobs == 0
    assert conversation == [
        {"role": "user", "content": [{"type": "text", "text": "a"}], "name": "ann"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"}]


@pytest.mark.parametrize("body, text", [
    ({"logit_bias": {"0": 0}}, "logit bias is not currently supported"),
    ({"top_logprobs": 2}, "`top_logprobs` can only be used when `logprobs` is True"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]},
     "having tools in the request requires --tool-call-parser to be set"),
    ({"tool_choice": "auto"}, '"auto" tool choice requires --tool-call-parser to be set'),
    ({"tool_choice": "required"}, "tool_choice 'required' or a named tool needs guided decoding"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls=false is not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format 'json_object' is not supported"),
    ({"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]},
     "a message's function_call is not supported by this server; use tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]}]},
     "the arguments of tool call 'c1' are not JSON"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "only text message is supported, but got image_url"),
])
def test_chat_refusals(body, text):
    assert text in refusal(lambda b, d: requests.chat(b, d), {"model": "m", "messages": MESSAGES, **body})


def test_strict_tools_are_refused():
    tools = [{"type": "function", "function": {"name": "f", "strict": True}}]
    assert "a tool's 'strict': true) needs guided decoding" in refusal(
        lambda b, d: requests.chat(b, d, "llama3"), {"model": "m", "messages": MESSAGES, "tools": tools})


def test_tools_go_to_the_template_and_the_parser():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    gen, _ = requests.chat({"model": "m", "messages": MESSAGES, "tools": tools}, 16, "llama3")
    assert (gen.tools, gen.tool_parser) == (tools, "llama3")
    gen, _ = requests.chat({"model": "m", "messages": MESSAGES, "tools": tools, "tool_choice": "none"}, 16)
    assert (gen.tools, gen.tool_parser) == (None, "")
    assert requests.chat({"model": "m", "messages": MESSAGES}, 16, "llama3")[0].tool_parser == ""


def test_tool_call_formats():
    from tritond.frontend.openai.tool_calls import may_be_calls, parse
    names = {"f", "g"}
    calls = parse("llama3", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "arguments": {}}',
                  names)
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "f", {"x": 1}), ("function", "g", {})]
    assert parse("llama3", '{"name": "f", "parameters": {}}', names)[0]["id"].startswith("call-")
    assert parse("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": "b"}}]', names)[0]["function"] == \
        {"name": "f", "arguments": '{"a": "b"}'}
    assert parse("llama3", "plain text", names) is None and parse("llama3", '{"no": "name"}', names) is None
    assert parse("mistral", "[not json", names) is None
    assert may_be_calls("llama3", "<|py") and may_be_calls("llama3", '{"na') and not may_be_calls("llama3", "Hi")
    assert may_be_calls("mistral", "[TOOL") and not may_be_calls("mistral", "Sure")


def test_json_answers_that_are_not_calls_of_offered_tools_stay_text():
    from tritond.frontend.openai.tool_calls import parse
    assert parse("llama3", '{"name": "f", "age": 3}', {"f"}) is None
    assert parse("llama3", '{"name": "h", "arguments": {}}', {"f"}) is None
    assert parse("mistral", '[TOOL_CALLS] [{"name": "f"}]', {"f"}) is None
