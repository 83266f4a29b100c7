"""The OpenAI app through ASGI with a stand-in for the dataplane: who may call which route (its
own and HTTP's restrictions), CPU work kept off the event loop, the host sampler started by the
first scrape, and a stream closed as soon as its client leaves."""
from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest
from starlette.requests import ClientDisconnect

from tritond.frontend.openai.app import ClosingStreamingResponse, HttpRestrictions, OpenAIApi, json_response
from tritond.wire.options import OpenAIConfig

CHAT_BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Client:
    table = SimpleNamespace(names={"m"}, table=None)

    @staticmethod
    def ready(strict: bool) -> bool:
        return True


def api(tokenizer=None, **kwargs) -> OpenAIApi:
    dp = SimpleNamespace(client=Client(), entry=lambda name: SimpleNamespace(name=name))
    return OpenAIApi(dp, OpenAIConfig(address="127.0.0.1", port=9), tokenizer, 1 << 20, **kwargs)


def call(app, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
         ) -> tuple[int, dict | bytes]:
    """One request through the ASGI app: its status and body (parsed when JSON)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 9),
             "headers": [(k.lower().encode(), v.encode()) for k, v in {**(headers or {}),
                                                                      "content-length": str(len(body))}.items()]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    raw = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return sent[0]["status"], json.loads(raw)
    except ValueError:
        return sent[0]["status"], raw


def test_the_chat_template_renders_off_the_event_loop():
    threads = []

    def render(messages, tools):
        threads.append(threading.current_thread())
        return "prompt"

    async def generate(request, entry, gen, chat):
        return json_response({"prompt": gen.prompt})

    a = api(SimpleNamespace(template=object(), render=render))
    a.generate = generate
    assert call(a.app(), "POST", "/v1/chat/completions", CHAT_BODY) == (200, {"prompt": "prompt"})
    assert threads and threads[0] is not threading.main_thread()


def test_https_restricted_apis_hold_on_the_openai_port():
    async def generate(request, entry, gen, chat):
        return json_response({})

    class Admins:
        @staticmethod
        def admits(certificate: bytes | None) -> bool:
            return certificate == b"admin"

    who = {"certificate": b"user"}
    a = api(SimpleNamespace(template=object(), render=lambda m, t: "p"), http=HttpRestrictions(
        {"inference": ("infer-key", "s")}, {"metadata": Admins()}, lambda scope: who["certificate"]))
    a.generate = generate
    app = a.app()
    status, body = call(app, "POST", "/v1/chat/completions", CHAT_BODY)
    assert status == 403 and body["error"]["message"] == "This API is restricted, expecting header 'infer-key'"
    assert call(app, "POST", "/v1/chat/completions", CHAT_BODY, {"infer-key": "s"})[0] == 200
    status, body = call(app, "GET", "/v1/models")
    assert status == 403 and "authorized certificate subject" in body["error"]["message"]
    assert call(app, "GET", "/health/ready")[0] == 200
    who["certificate"] = b"admin"
    assert call(app, "GET", "/v1/models") == (200, {"object": "list", "data": []})


def test_the_host_sampler_starts_with_the_first_scrape():
    class Endpoint:
        task = None
        starts = 0

        def start(self) -> None:
            self.starts += 1
            self.task = object()

        async def render(self) -> bytes:
            return b"metrics"

    endpoint = Endpoint()
    app = api(metrics=endpoint).app()
    assert endpoint.starts == 0
    for _ in range(2):
        assert call(app, "GET", "/metrics")[0] == 200
    assert endpoint.starts == 1


def test_a_stream_the_client_left_is_closed_at_once():
    closed = []

    async def events():
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            closed.append(True)

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client went away")

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {}

    async def respond() -> list:
        response = ClosingStreamingResponse(events(), media_type="text/event-stream")
        with pytest.raises(ClientDisconnect):
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
        return list(closed)     # before the loop's shutdown closes what is left open

    assert asyncio.run(respond()) == [True]
