"""The OpenAI-compatible frontend through the real `openai` client against a running tritond:
models, completions and chat completions (streaming and not, n choices, stop, seed, echo,
usage), the chat template of a tokenizer built here, Triton's error bodies and statuses, the
restricted API, a client that goes away mid-stream (the model sees the cancellation) and
several streams at once. The server is left with no process and no /dev/shm segment."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import socket
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from chat_tokenizer import render, write_tokenizer
from conftest import ROOT, TritondServer, build_example_repository, free_port, serving, wait_for

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")
from tokenizers import Tokenizer  # noqa: E402


def _tiny_llm() -> types.ModuleType:
    """The example model's own generation function (its pb_utils import stubbed)."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    path = ROOT / "examples" / "model_repository" / "tiny_llm" / "1" / "model.py"
    spec = importlib.util.spec_from_file_location("tiny_llm_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = _tiny_llm()


def expected(prompt: str, **settings) -> str:
    return "".join(TINY.generate(prompt, {"max_tokens": 16, **settings}))


EMBEDDER_CONFIG = """name: "embedder"
backend: "python"
max_batch_size: 0
input [ { name: "embedding_request" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


SAY_CONFIG = """name: "say_llm"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def openai_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("openai")
    repo = build_example_repository(base / "models", ("tiny_llm", "toy_llm", "identity_fp32"))
    markers = base / "cancelled"
    markers.mkdir()
    shutil.copytree(repo / "tiny_llm", repo / "slow_llm")
    config = (repo / "slow_llm" / "config.pbtxt").read_text().replace('name: "tiny_llm"', 'name: "slow_llm"')
    config += (f'parameters {{ key: "token_delay_ms" value: {{ string_value: "100" }} }}\n'
               f'parameters {{ key: "cancel_marker_dir" value: {{ string_value: "{markers}" }} }}\n')
    (repo / "slow_llm" / "config.pbtxt").write_text(config)
    (repo / "embedder" / "1").mkdir(parents=True)
    shutil.copyfile(ROOT / "tests" / "fixtures" / "embedding_model.py", repo / "embedder" / "1" / "model.py")
    (repo / "embedder" / "config.pbtxt").write_text(EMBEDDER_CONFIG)
    (repo / "say_llm" / "1").mkdir(parents=True)
    shutil.copyfile(ROOT / "tests" / "fixtures" / "say_model.py", repo / "say_llm" / "1" / "model.py")
    (repo / "say_llm" / "config.pbtxt").write_text(SAY_CONFIG)
    tokenizer = write_tokenizer(base / "tokenizer")
    port = free_port()
    server = TritondServer(repo, ["--openai-port", str(port), "--tokenizer", str(tokenizer),
                                  "--openai-restricted-api", "metrics", "metrics-key", "secret",
                                  "--tool-call-parser", "llama3"])
    with serving(server) as s:
        s.openai_port = port
        s.markers = markers
        s.tokenizer = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
        yield s


@pytest.fixture
def client(openai_server):
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{openai_server.openai_port}/v1", api_key="EMPTY", max_retries=0,
                      timeout=60)
    yield c
    c.close()


def raw(server, request: bytes) -> tuple[int, dict | str]:
    """One raw HTTP/1.1 exchange: the status and the body (JSON when it is)."""
    with socket.create_connection(("127.0.0.1", server.openai_port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def refused(call, kind=None) -> str:
    """The detail of the error an OpenAI client call answers (400 unless `kind` says)."""
    with pytest.raises(kind or openai.BadRequestError) as info:
        call()
    return info.value.response.json()["detail"]


def post(server, path: str, body: bytes, headers: str = "") -> tuple[int, dict | str]:
    return raw(server, f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                       f"{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body)


# ---------------------------------------------------------------- models

def test_models_lists_the_ready_models(client):
    ids = {m.id for m in client.models.list().data}
    assert ids == {"tiny_llm", "toy_llm", "identity_fp32", "slow_llm", "embedder", "say_llm"}
    model = client.models.retrieve("tiny_llm")
    assert (model.id, model.object, model.owned_by) == ("tiny_llm", "model", "Triton Inference Server")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nope")
    assert info.value.body == {"detail": "Unknown model: nope"} or info.value.response.json() == \
        {"detail": "Unknown model: nope"}


# ---------------------------------------------------------------- completions

def test_a_completion(client):
    r = client.completions.create(model="tiny_llm", prompt="hello model", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.model == "tiny_llm" and r.id.startswith("cmpl-")
    (choice,) = r.choices
    assert choice.text == expected("hello model", max_tokens=5, temperature=0)
    assert choice.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (2, 5, 7)


def test_a_streamed_completion_is_the_same_text_in_pieces(client):
    chunks = list(client.completions.create(model="tiny_llm", prompt="stream this", max_tokens=6, seed=4,
                                            temperature=1.5, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) == 6
    assert "".join(pieces) == expected("stream this", max_tokens=6, seed=4, temperature=1.5)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_stop_seed_echo_and_n(client):
    text = expected("p", temperature=0)
    stop = text.split()[3]
    r = client.completions.create(model="tiny_llm", prompt="p", temperature=0, stop=[" " + stop], echo=True)
    assert r.choices[0].text == "p" + text[: text.index(" " + stop)]
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="tiny_llm", prompt="p", temperature=1.0, seed=10, n=3, max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [expected("p", temperature=1.0, seed=10 + i, max_tokens=8)
                                           for i in range(3)]
    assert r.usage.completion_tokens == 24


def test_n_streamed_choices_interleave(client):
    chunks = list(client.completions.create(model="tiny_llm", prompt="q", n=2, max_tokens=4, seed=1, stream=True))
    texts = ["", ""]
    for c in chunks:
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == [expected("q", max_tokens=4, seed=1 + i) for i in range(2)]
    assert sum(c.choices[0].finish_reason == "length" for c in chunks) == 2


def test_usage_from_the_tokenizer_when_the_model_does_not_count(client, openai_server):
    """toy_llm has TensorRT-LLM's form (`max_tokens` input) and reports no counts."""
    r = client.completions.create(model="toy_llm", prompt="hello model", max_tokens=3)
    text = r.choices[0].text
    assert r.usage.prompt_tokens == len(openai_server.tokenizer.encode("hello model").ids)
    assert r.usage.completion_tokens == len(openai_server.tokenizer.encode(text, add_special_tokens=False).ids)


def test_logprobs_of_a_model_that_returns_them(client):
    steps = []
    words = TINY.generate("log me", {"max_tokens": 4, "temperature": 0}, steps)
    r = client.completions.create(model="tiny_llm", prompt="log me", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == words and lp.text_offset == [0, *[len("".join(words[:i])) for i in range(1, 4)]]
    assert lp.token_logprobs == pytest.approx([float(step[pick]) for pick, step in steps])
    assert all(len(top) in (2, 3) for top in lp.top_logprobs)
    chunks = list(client.chat.completions.create(model="tiny_llm", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=3, logprobs=True, top_logprobs=1, stream=True))
    content = [c.choices[0].logprobs.content for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(content) == 3 and all(len(one) == 1 and one[0].top_logprobs for one in content)
    assert "does not return logprobs" in refused(
        lambda: client.completions.create(model="toy_llm", prompt="x", logprobs=1))


# ---------------------------------------------------------------- chat

def test_a_chat_completion_renders_the_template(client):
    messages = [{"role": "system", "content": "be fast"}, {"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="tiny_llm", messages=messages, max_completion_tokens=7,
                                       temperature=0)
    assert r.object == "chat.completion"
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected(render(messages), max_tokens=7, temperature=0)
    assert r.usage.prompt_tokens == len(render(messages).split())


def test_a_streamed_chat_completion(client):
    messages = [{"role": "user", "content": "stream a chat"}]
    chunks = list(client.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=5, seed=2,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected(render(messages), max_tokens=5, seed=2)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.prompt_tokens == len(render(messages).split()) and chunks[-1].usage.completion_tokens == 5


def test_several_streams_at_once(openai_server):
    async def one(c, i):
        messages = [{"role": "user", "content": f"prompt number {i}"}]
        stream = await c.chat.completions.create(model="tiny_llm", messages=messages, max_tokens=12, seed=i,
                                                 stream=True)
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
        assert text == expected(render(messages), max_tokens=12, seed=i)

    async def main():
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{openai_server.openai_port}/v1", api_key="EMPTY",
                               max_retries=0, timeout=60)
        try:
            await asyncio.gather(*(one(c, i) for i in range(16)))
        finally:
            await c.close()

    asyncio.run(main())


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def test_tool_calls_in_llama3_format(client):
    call = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    messages = [{"role": "user", "content": f"SAY[{call}]END"}]
    r = client.chat.completions.create(model="say_llm", messages=messages, tools=TOOLS)
    (made,) = r.choices[0].message.tool_calls
    assert made.type == "function" and made.function.name == "get_weather"
    assert json.loads(made.function.arguments) == {"city": "Paris"} and r.choices[0].finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(model="say_llm", messages=messages, tools=TOOLS, stream=True))
    made = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in made] == [
        (0, "get_weather", {"city": "Paris"})]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    text = "Hello there, no tools needed"
    chunks = list(client.chat.completions.create(model="say_llm", messages=[
        {"role": "user", "content": f"SAY[{text}]END"}], tools=TOOLS, stream=True))
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(contents) == text and len(contents) > 1      # streamed once it could not be a call
    r = client.chat.completions.create(model="say_llm", messages=messages, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == call and not r.choices[0].message.tool_calls


# ---------------------------------------------------------------- embeddings

def test_embeddings(client):
    spec = importlib.util.spec_from_file_location("embedding_model", ROOT / "tests" / "fixtures" / "embedding_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = client.embeddings.create(model="embedder", input="some words here", encoding_format="float")
    assert r.object == "list" and r.model == "embedder"
    (item,) = r.data
    assert item.index == 0 and item.embedding == pytest.approx(module.embed("some words here", 8))
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (3, 3)
    r = client.embeddings.create(model="embedder", input=[5, 6, 7], dimensions=4)     # base64 by default
    assert r.data[0].embedding == pytest.approx(module.embed([5, 6, 7], 4), abs=1e-6)
    assert r.usage.prompt_tokens == 3
    assert "is not an embedding model" in refused(lambda: client.embeddings.create(model="tiny_llm", input="x"))


# ---------------------------------------------------------------- cancellation

def test_a_client_that_goes_away_mid_stream_cancels_the_model(client, openai_server):
    before = set(openai_server.markers.iterdir())
    stream = client.chat.completions.create(model="slow_llm", messages=[{"role": "user", "content": "go"}],
                                            max_tokens=300, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    new = wait_for(lambda: set(openai_server.markers.iterdir()) - before, 15, "the model to see is_cancelled()")
    (marker,) = new
    assert 3 <= int(marker.read_text()) < 300


def test_a_client_that_goes_away_cancels_every_choice(client, openai_server):
    before = set(openai_server.markers.iterdir())
    stream = client.completions.create(model="slow_llm", prompt="go", n=3, max_tokens=300, stream=True)
    for i, _ in enumerate(stream):
        if i == 6:
            break
    stream.close()
    new = wait_for(lambda: len(set(openai_server.markers.iterdir()) - before) == 3 and
                   set(openai_server.markers.iterdir()) - before, 15, "every choice to see is_cancelled()")
    assert all(int(m.read_text()) < 300 for m in new)


def test_a_client_that_goes_away_before_the_answer_cancels_the_model(openai_server):
    before = set(openai_server.markers.iterdir())
    body = json.dumps({"model": "slow_llm", "prompt": "wait", "max_tokens": 300}).encode()
    with socket.create_connection(("127.0.0.1", openai_server.openai_port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)
    wait_for(lambda: set(openai_server.markers.iterdir()) - before, 15, "the model to see is_cancelled()")


# ---------------------------------------------------------------- errors

def test_errors_as_triton_answers_them(client, openai_server):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="nope", prompt="x")
    assert info.value.response.json() == {"detail": "Unknown model: nope"}
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="tiny_llm", messages=[{"role": "user", "content": "x"}], temperature=3)
    (detail,) = info.value.response.json()["detail"]
    assert detail["msg"] == "Input should be less than or equal to 2" and detail["loc"] == ["body", "temperature"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny_llm", messages=[{"role": "user", "content": "x"}],
                                       logit_bias={"1": 1})
    assert info.value.response.json() == {"detail": "logit bias is not currently supported"}
    assert "does not have the interface of an LLM" in refused(
        lambda: client.completions.create(model="identity_fp32", prompt="x"))
    assert "model 'toy_llm' does not support 'temperature'" in refused(
        lambda: client.completions.create(model="toy_llm", prompt="x", temperature=0.5))
    assert "the chat template refused" in refused(lambda: client.chat.completions.create(
        model="tiny_llm", messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]))
    status, body = post(openai_server, "/v1/completions", b"{not json")
    assert status == 422 and body["detail"][0]["msg"] == "JSON decode error"
    status, body = raw(openai_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      b"Content-Length: 100000000\r\n\r\n")
    assert status == 413 and body["error"]["code"] == "content_too_large"
    status, body = raw(openai_server, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (status, body) == (404, {"detail": "Not Found"})
    # the server still serves
    assert client.completions.create(model="tiny_llm", prompt="ok", max_tokens=1).choices[0].text


def test_what_is_too_large_or_malformed_is_refused_in_a_few_words(client, openai_server):
    body = json.dumps({"model": "tiny_llm", "messages": [{"x": 1}] * 131_072}).encode()
    status, detail = post(openai_server, "/v1/chat/completions", body)
    assert status == 422 and [e["type"] for e in detail["detail"]] == ["too_long"]
    body = json.dumps({"model": "tiny_llm", "messages": [{"x": 1}] * 2000}).encode()
    status, detail = post(openai_server, "/v1/chat/completions", body)
    assert status == 422 and len(detail["detail"]) == 10
    deep = "[" * 5000 + "]" * 5000
    assert "are not JSON" in refused(lambda: client.chat.completions.create(model="tiny_llm", messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": deep}}]}]))
    assert "at most 16 choices" in refused(lambda: client.completions.create(model="tiny_llm", prompt="x", n=17))
    assert refused(lambda: client.completions.create(model="tiny_llm", prompt="x", max_tokens=10**9)) == \
        "max_tokens 1000000000 exceeds the max_tokens_limit 4096 of model 'tiny_llm'"
    assert client.completions.create(model="tiny_llm", prompt="ok", max_tokens=1).choices[0].text


def test_restricted_api_metrics_and_health(openai_server):
    get = "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}\r\n"
    status, body = raw(openai_server, get.format("/metrics", "").encode())
    assert status == 401 and body["error"] == {
        "message": "This API is restricted, expecting header 'metrics-key' with valid value",
        "type": "authentication_error", "code": "invalid_auth"}
    status, body = raw(openai_server, get.format("/metrics", "metrics-key: secret\r\n").encode())
    assert status == 200 and 'nv_inference_request_success{model="tiny_llm",version="1"}' in body
    assert 'tritond_process_cpu_seconds{role="openai"}' in body
    assert raw(openai_server, get.format("/health/ready", "").encode())[0] == 200


def test_a_tokenizer_that_cannot_serve_stops_startup(tmp_path):
    repo = build_example_repository(tmp_path / "models", ("identity_fp32",))
    server = TritondServer(repo, ["--openai-port", str(free_port()), "--tokenizer", str(tmp_path / "missing")])
    with serving(server, wait="exit", code=1):
        pass
    assert "--tokenizer" in server.log and "not a directory" in server.log
    server = TritondServer(repo, ["--tokenizer", str(Path(tmp_path))])
    with serving(server, wait="exit", code=1):
        pass
    assert "--tokenizer need --openai-port" in server.log


# ---------------------------------------------------------------- model management

def test_load_and_unload_are_refused_outside_explicit_mode(openai_server):
    for verb in ("load", "unload"):
        assert post(openai_server, f"/v1/models/tiny_llm/{verb}", b"") == (
            400, {"detail": "Model load/unload requires --model-control-mode=explicit"})


def test_load_and_unload_in_explicit_mode(tmp_path):
    """Triton's frontend's answers: a model not loaded is unknown (400), loading a loaded model
    or unloading one not loaded is 400, a model not in the repository fails to load (500), and
    of concurrent loads of one model one succeeds."""
    repo = build_example_repository(tmp_path / "models", ("tiny_llm", "identity_fp32"))
    port = free_port()
    server = TritondServer(repo, ["--openai-port", str(port), "--model-control-mode=explicit"])
    with serving(server) as s:
        s.openai_port = port
        completion = json.dumps({"model": "tiny_llm", "prompt": "hi", "max_tokens": 2}).encode()
        assert post(s, "/v1/completions", completion) == (400, {"detail": "Unknown model: tiny_llm"})
        status, body = post(s, "/v1/models/tiny_llm/load", b"")
        assert status == 200 and body["id"] == "tiny_llm" and body["owned_by"] == "Triton Inference Server"
        assert post(s, "/v1/completions", completion)[0] == 200
        assert post(s, "/v1/models/tiny_llm/load", b"") == (400, {"detail": "Model 'tiny_llm' is already loaded"})
        assert post(s, "/v1/models/tiny_llm/unload", b"") == (200, {"status": "success", "model": "tiny_llm"})
        assert post(s, "/v1/models/tiny_llm/unload", b"") == (400, {"detail": "Unknown model: tiny_llm"})
        assert post(s, "/v1/completions", completion) == (400, {"detail": "Unknown model: tiny_llm"})
        status, body = post(s, "/v1/models/nothing/load", b"")
        assert status == 500 and "failed to poll from model repository" in body["detail"]
        with ThreadPoolExecutor(4) as pool:
            codes = sorted(pool.map(lambda _: post(s, "/v1/models/identity_fp32/load", b"")[0], range(4)))
        assert codes == [200, 400, 400, 400]
