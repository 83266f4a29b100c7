"""The OpenAI bodies and event streams built from a model's pieces: finish reasons, usage, echo,
an error after the stream began, and a streamed answer held back while it could be tool calls."""
import asyncio
import json

from tritond.frontend.openai.generation import Piece, Tally
from tritond.frontend.openai.requests import Generation
from tritond.frontend.openai.responses import Reply
from tritond.wire.errors import internal


def run(reply: Reply, pieces: list, error=None) -> list:
    async def rest():
        for p in pieces[1:]:
            yield p
        if error is not None:
            raise error

    async def collect():
        return [e async for e in reply.events(pieces[0], rest())]
    events = asyncio.run(collect())
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    return [e[6:-2].decode() if e[6:-2] == b"[DONE]" else json.loads(e[6:-2]) for e in events]


def test_a_completion_body_with_echo_usage_and_finish_reasons():
    gen = Generation("m", "say", 2, n=2, echo=True)
    tally = Tally(2)
    for p in (Piece(0, " a", False, 1, 1), Piece(1, " b", True, 1, 1), Piece(0, " c", True, None, 1)):
        tally.add(p)
    body = Reply("cmpl-1", 5, gen, False, None).body(tally)
    assert body["object"] == "text_completion" and body["model"] == "m" and body["created"] == 5
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "say a c", "length"), (1, "say b", "stop")]
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    assert Reply("x", 0, Generation("m", "p", 2), False, None).body(Tally(1))["usage"] is None


def test_a_chat_stream_with_usage():
    gen = Generation("m", "p", 8, stream=True, include_usage=True)
    got = run(Reply("cmpl-2", 0, gen, True, None), [Piece(0, "Hi", False, 3, 1), Piece(0, " there", True, 3, 1)])
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in got[1:3]] == [
        ({"content": "Hi"}, None), ({"content": " there"}, "stop")]
    assert got[3]["choices"] == [] and got[3]["usage"]["completion_tokens"] == 2
    assert got[3]["object"] == "chat.completion.chunk" and got[4] == "[DONE]"


def test_an_error_after_the_stream_began_is_an_event_that_ends_it():
    gen = Generation("m", "p", 8, stream=True)
    got = run(Reply("c", 0, gen, False, None), [Piece(0, "a", False)], internal("the model failed"))
    assert got[-1] == {"error": {"message": "the model failed", "type": "server_error", "code": 500}}
    assert "[DONE]" not in got


TOOL = {"type": "function", "function": {"name": "f"}}


def test_a_streamed_answer_is_held_while_it_could_be_tool_calls():
    gen = Generation("m", "p", 64, stream=True, tools=[TOOL], tool_parser="llama3")
    call = ['{"name": "f",', ' "parameters": {"x": 1}}', ""]
    got = run(Reply("c", 0, gen, True, None), [Piece(0, t, i == 2) for i, t in enumerate(call)])
    (chunk,) = [g for g in got[1:] if g != "[DONE]"]
    (made,) = chunk["choices"][0]["delta"]["tool_calls"]
    assert made["index"] == 0 and made["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert chunk["choices"][0]["finish_reason"] == "tool_calls"
    got = run(Reply("c", 0, gen, True, None), [Piece(0, "{no", False), Piece(0, "pe", False), Piece(0, "!", True)])
    assert [g["choices"][0]["delta"].get("content") for g in got[1:-1]] == ["{nope!"]
    got = run(Reply("c", 0, gen, True, None), [Piece(0, "Hi", False), Piece(0, " you", True)])
    assert [g["choices"][0]["delta"].get("content") for g in got[1:-1]] == ["Hi", " you"]


def test_a_held_answer_keeps_the_logprobs_of_its_pieces():
    gen = Generation("m", "p", 64, stream=True, tools=[TOOL], tool_parser="llama3", logprobs=0)
    pieces = [Piece(0, t, i == 2, logprobs=[{"7": {"logprob": -1.0 - i, "rank": 1, "decoded_token": t}}])
              for i, t in enumerate(["{no", "pe", "!"])]
    got = run(Reply("c", 0, gen, True, None), pieces)
    (chunk,) = got[1:-1]
    assert chunk["choices"][0]["delta"]["content"] == "{nope!"
    assert [c["logprob"] for c in chunk["choices"][0]["logprobs"]["content"]] == [-1.0, -2.0, -3.0]


def test_stream_usage_is_counted_off_the_event_loop():
    import threading
    from types import SimpleNamespace
    threads = []

    def count(text, special_tokens):
        threads.append(threading.current_thread())
        return 1

    gen = Generation("m", "p", 8, stream=True, include_usage=True)
    got = run(Reply("c", 0, gen, False, SimpleNamespace(encoder=object(), count=count)), [Piece(0, "a", True)])
    assert got[-2]["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert threads and threading.main_thread() not in threads
