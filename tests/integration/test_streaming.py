"""Decoupled models, generate and cancellation through the real clients: 0, 1 and N responses
on a gRPC stream (each with `triton_final_response`, the bare final flag on request), responses
sent from a thread the model started, an error part-way, non-streaming calls refused with
Triton's errors, generate and generate_stream (SSE) with the toy LLM, BLS iterating a decoupled
model, an ensemble whose decoupled step streams, and clients that go away: the model sees
`is_cancelled()` and a queued request never runs."""
from __future__ import annotations

import http.client
import json
import queue
import socket
import time
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, build_example_repository, http_get, metric, serving, wait_for
from fault_models import started
from stream_models import slow_echo_markers

VOCAB = ["the", "a", "model", "server", "streams", "tokens", "one", "at", "time", "fast",
         "tiny", "and", "stateful", "triton", "python", "."]


def reference_tokens(prompt: bytes, count: int) -> list[str]:
    """The toy LLM's text for a prompt (examples/model_repository/toy_llm/1/model.py)."""
    rng = np.random.default_rng(zlib.crc32(prompt))
    return [VOCAB[i] for i in rng.integers(len(VOCAB), size=count)]


class Stream:
    """A tritonclient gRPC stream whose results are collected per request id until its final."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, value: int, request_id: str, model: str = "streamer", **params) -> None:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        self.client.async_stream_infer(model, [inp], request_id=request_id, parameters=params or None,
                                       enable_empty_final_response=True)

    def collect(self, request_id: str, timeout: float = 30) -> list:
        """(OUT or None, final flag, error message) of every response until the final one."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            result, error = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                out.append((None, True, error.message()))
                return out
            response = result.get_response()
            assert response.id == request_id
            final = response.parameters["triton_final_response"].bool_param
            values = result.as_numpy("OUT")
            out.append((None if values is None else int(values[0]), final, None))
            if final:
                return out

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(streaming_server):
    s = Stream(streaming_server.grpc_url)
    yield s
    s.close()


@pytest.mark.parametrize("count", [0, 1, 5])
def test_zero_one_and_n_responses_then_the_final_flag(stream, count):
    stream.send(10, f"n{count}", count=count)
    assert stream.collect(f"n{count}") == [(10 + i, False, None) for i in range(count)] + [(None, True, None)]


def test_the_last_response_may_carry_the_final_flag(stream):
    stream.send(0, "wf", count=2, with_final=True)
    assert stream.collect("wf") == [(0, False, None), (1, True, None)]


def test_responses_from_a_thread_the_model_started(stream):
    for i in range(3):
        stream.send(100 * i, f"t{i}", count=4, thread=True)
    by_id: dict[str, list] = {}
    while len(by_id) < 3 or not all(v[-1][1] for v in by_id.values()):
        result, error = stream.results.get(timeout=30)
        assert error is None
        response = result.get_response()
        values = result.as_numpy("OUT")
        by_id.setdefault(response.id, []).append(
            (None if values is None else int(values[0]), response.parameters["triton_final_response"].bool_param))
    for i in range(3):
        assert by_id[f"t{i}"] == [(100 * i + k, False) for k in range(4)] + [(None, True)]


def test_an_error_part_way_ends_the_request_and_the_stream_goes_on(stream):
    stream.send(0, "bad", count=5, fail_after=2)
    got = stream.collect("bad")
    assert got[:2] == [(0, False, None), (1, False, None)]
    assert got[2][2].startswith("Failed to process the request(s) for model 'streamer_0_0', message: "
                                "RuntimeError: failed after 2 responses\n\nAt:\n"), got[2][2]
    stream.send(7, "next", count=1)
    assert stream.collect("next") == [(7, False, None), (None, True, None)]


def test_with_triton_grpc_error_a_decoupled_models_error_ends_the_stream_with_its_status(streaming_server):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(streaming_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)),
                        headers={"triton_grpc_error": "true"})
    try:
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([0], np.int32))
        client.async_stream_infer("streamer", [inp], request_id="bad", parameters={"count": 5, "fail_after": 2})
        got = [results.get(timeout=30) for _ in range(3)]
        assert [int(r.as_numpy("OUT")[0]) for r, _ in got[:2]] == [0, 1]
        error = got[2][1]
        assert error is not None and error.status() == "StatusCode.INTERNAL", error
        assert "failed after 2 responses" in error.message()
        with pytest.raises(queue.Empty):        # the stream ended: nothing more comes
            results.get(timeout=1)
    finally:
        client.stop_stream()
        client.close()
    assert http_get(f"http://{streaming_server.http_url}/v2/health/live")[0] == 200


def test_non_streaming_calls_to_a_decoupled_model_are_refused(streaming_server):
    grpc = grpcclient.InferenceServerClient(streaming_server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("streamer", [inp])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    http = httpclient.InferenceServerClient(streaming_server.http_url)
    hinp = httpclient.InferInput("IN", [1], "INT32")
    hinp.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        http.infer("streamer", [hinp])
    assert info.value.status() == "501"
    assert "doesn't support models with decoupled transaction policy" in info.value.message()


def post(server, path: str, body: dict) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(*server.http_url.split(":"))
    conn.request("POST", path, json.dumps(body))
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, response.getheader("Content-Type"), data


def events(data: bytes) -> list[dict]:
    chunks = [c for c in data.decode().split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [json.loads(c[len("data: "):]) for c in chunks]


def test_generate_stream_sends_each_token_as_an_event(streaming_server):
    status, ctype, data = post(streaming_server, "/v2/models/toy_llm/generate_stream",
                               {"text_input": "Once upon a time", "max_tokens": 12, "id": "g1"})
    assert status == 200 and ctype == "text/event-stream; charset=utf-8"
    got = events(data)
    assert [e["text_output"] for e in got] == reference_tokens(b"Once upon a time", 12)
    assert got[0] == {"id": "g1", "model_name": "toy_llm", "model_version": "1", "text_output": got[0]["text_output"]}


def test_generate_answers_one_response_as_json(streaming_server):
    status, ctype, data = post(streaming_server, "/v2/models/toy_llm/generate", {"text_input": "hi", "max_tokens": 1})
    assert status == 200 and ctype == "application/json"
    assert json.loads(data) == {"model_name": "toy_llm", "model_version": "1",
                                "text_output": reference_tokens(b"hi", 1)[0]}
    status, ctype, data = post(streaming_server, "/v2/models/toy_llm/generate", {"text_input": "hi", "max_tokens": 3})
    assert (status, ctype) == (500, "application/json")     # Triton's INTERNAL: never a 200 with an error
    assert json.loads(data) == {"error": "generate expects model to produce exactly 1 response, use generate "
                                         "stream for model that generates various number of responses"}
    status, _, data = post(streaming_server, "/v2/models/accumulator/generate", {"INPUT": 2.5})
    assert status == 400 and "must specify a non-zero or non-empty correlation ID" in json.loads(data)["error"]
    status, _, data = post(streaming_server, "/v2/models/toy_llm/generate_stream", {"text_input": 5})
    assert status == 400 and "attempt to access JSON non-string as string" in json.loads(data)["error"]


def test_errors_of_a_streamed_generate_come_in_the_stream(streaming_server):
    status, _, data = post(streaming_server, "/v2/models/streamer/generate_stream",
                           {"IN": 3, "parameters": {"count": 4, "fail_after": 2}})
    assert status == 200
    got = events(data)
    assert got[:2] == [{"OUT": 3, "model_name": "streamer", "model_version": "1"},
                       {"OUT": 4, "model_name": "streamer", "model_version": "1"}]
    assert len(got) == 3 and got[2]["error"].startswith(
        "Failed to process the request(s) for model 'streamer_0_0', message: RuntimeError: failed after 2 responses")


def test_a_client_that_cancels_mid_stream_stops_the_model(streaming_server, tmp_path):
    marker = tmp_path / "grpc-cancelled"
    s = Stream(streaming_server.grpc_url)
    s.send(0, "c", cancel_marker=str(marker))
    for _ in range(3):
        assert s.results.get(timeout=30)[1] is None
    s.close(cancel=True)
    wait_for(marker.exists, 10, "the model to see is_cancelled()")
    sent = int(marker.read_text())
    assert 3 <= sent < 3000


def test_an_sse_client_that_goes_away_stops_the_model(streaming_server, tmp_path):
    marker = tmp_path / "sse-cancelled"
    host, port = streaming_server.http_url.split(":")
    body = json.dumps({"IN": 0, "parameters": {"cancel_marker": str(marker)}}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v2/models/streamer/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(4096)
    wait_for(marker.exists, 10, "the model to see is_cancelled()")


def test_a_bls_model_iterates_a_decoupled_model(streaming_server):
    client = httpclient.InferenceServerClient(streaming_server.http_url)
    inp = httpclient.InferInput("PROMPT", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"tell me"], dtype=np.object_))
    text = client.infer("bls_llm", [inp]).as_numpy("TEXT")[0].decode()
    assert text == " ".join(reference_tokens(b"tell me", 6))
    client.close()


def test_an_ensemble_with_a_decoupled_step_streams(streaming_server, stream):
    config = stream.client.get_model_config("llm_ensemble", as_json=True)["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"ensemble"], dtype=np.object_))
    limit = grpcclient.InferInput("LIMIT", [1], "INT32")
    limit.set_data_from_numpy(np.array([4], np.int32))
    stream.client.async_stream_infer("llm_ensemble", [prompt, limit], request_id="e",
                                     enable_empty_final_response=True)
    tokens = []
    while True:
        result, error = stream.results.get(timeout=30)
        assert error is None
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        tokens.append(result.as_numpy("TOKEN")[0].decode())
    assert tokens == reference_tokens(b"ensemble", 4)
    http = httpclient.InferenceServerClient(streaming_server.http_url)
    hp = httpclient.InferInput("PROMPT", [1], "BYTES")
    hp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    hl = httpclient.InferInput("LIMIT", [1], "INT32")
    hl.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException, match="decoupled transaction policy"):
        http.infer("llm_ensemble", [hp, hl])
    http.close()


@pytest.mark.parametrize("count", [0, 3])
def test_each_response_of_a_decoupled_step_runs_the_step_it_feeds(stream, count):
    """fan_ensemble: every value the streamer sends is squared on its own and streamed back as
    one response of the ensemble; the final flag comes on the last of them when the streamer has
    ended by then, else alone."""
    stream.send(2, "fan", model="fan_ensemble", count=count)
    got = stream.collect("fan")
    assert got[-1][1] and all(not final for _, final, _ in got[:-1]) and all(e is None for _, _, e in got)
    assert sorted(v for v, _, _ in got if v is not None) == [(2 + i) ** 2 for i in range(count)]


def test_an_error_of_the_decoupled_step_ends_the_ensemble_request(stream):
    stream.send(2, "fan-fail", model="fan_ensemble", count=2, fail_after=1)
    got = stream.collect("fan-fail")
    assert got[-1][2] is not None and "fan_ensemble" in got[-1][2]


def test_a_client_that_disconnects_takes_its_queued_request_out(streaming_server, tmp_path):
    """slow_echo runs one request at a time for 1 s; an HTTP client that disconnects and a gRPC
    client whose deadline passes leave while queued behind it: theirs never run."""
    host, port = streaming_server.http_url.split(":")
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
    request = (b"POST /v2/models/slow_echo/infer HTTP/1.1\r\nHost: x\r\n"
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    markers = slow_echo_markers(streaming_server.repos[0])
    first = socket.create_connection((host, int(port)))
    first.sendall(request)
    wait_for(lambda: started(markers) == 1, 30, "the first request to execute")
    with socket.create_connection((host, int(port))) as second:
        second.sendall(request)
        wait_for(lambda: metric(streaming_server, "nv_inference_pending_request_count", 0, model="slow_echo") == 1,
                 30, "the second request to queue behind the first")
    # ... and now it is gone
    grpc = grpcclient.InferenceServerClient(streaming_server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        grpc.infer("slow_echo", [inp], client_timeout=0.2)
    assert b"200 OK" in first.recv(4096)
    first.close()
    time.sleep(1.2)                                   # a queued request that ran would take 1 s
    assert started(markers) == 1
    stats = httpclient.InferenceServerClient(streaming_server.http_url).get_inference_statistics("slow_echo")
    assert stats["model_stats"][0]["execution_count"] == 1
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 2      # both answered CANCELLED


@pytest.mark.parametrize("model", ["toy_llm", "toy_llm_ensemble"])
def test_the_first_response_histogram_times_a_decoupled_requests_first_response(tmp_path, model):
    """As Triton's: for a decoupled model, and an ensemble over one, the first-response histogram
    (nv_inference_first_response_histogram_ms) times the first response, not the whole request."""
    from prometheus_client.parser import text_string_to_metric_families

    repo = build_example_repository(tmp_path / "models", ("toy_llm",))
    with open(repo / "toy_llm" / "config.pbtxt", "a") as f:
        f.write('\nparameters { key: "token_delay_ms" value: { string_value: "100" } }\n')
    (repo / "toy_llm_ensemble" / "1").mkdir(parents=True)
    (repo / "toy_llm_ensemble" / "config.pbtxt").write_text(
        'platform: "ensemble"\n'
        'input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },\n'
        '        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "toy_llm" model_version: -1\n'
        '  input_map { key: "text_input" value: "text_input" } input_map { key: "max_tokens" value: "max_tokens" }\n'
        '  output_map { key: "text_output" value: "text_output" } } ] }\n')
    with serving(TritondServer(repo, ["--metrics-config=histogram_latencies=true"])) as s:
        status, _, data = post(s, f"/v2/models/{model}/generate_stream", {"text_input": "x", "max_tokens": 6})
        assert status == 200 and len(events(data)) == 6
        _, body = http_get(f"http://127.0.0.1:{s.metrics_port}/metrics")
        samples = {sm.name: sm.value for f in text_string_to_metric_families(body.decode()) for sm in f.samples
                   if sm.labels.get("model") == model}
        assert samples["nv_inference_first_response_histogram_ms_count"] == 1
        request_ms = samples["nv_inference_request_duration_us_total"] / 1000
        assert request_ms >= 500 and samples["nv_inference_first_response_histogram_ms_sum"] < request_ms - 300
