"""What a new user and an attacker tried, through the real clients: gRPC serves the moment HTTP
says ready; a model whose only instance restarts queues requests instead of answering 404 and
is not ready from the moment its worker died; model names that are paths are 400; an
unparseable gRPC message is INVALID_ARGUMENT without internals; /v2 lists only extensions that
work; live stays true while the broker is stopped; tritonserver flags are accepted, ignored or
refused as documented."""
from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, expect_error, http_get, serving, wait_for
from fault_models import add_fault_model
from tritond.frontend.broker_client import BROKER_SILENCE_S

FLAGS = ["--model-control-mode=explicit", "--load-model=*", "--grpc-workers=2",
         "--backend-directory=/opt/tritonserver/backends", "--log-info=true", "--grpc-infer-allocation-pool-size=16"]


def start_watching_grpc(s: TritondServer) -> list[str]:
    """Start `s` and, the moment HTTP first answers ready, open fresh gRPC connections (one per
    gRPC worker and some): what failed. SO_REUSEPORT spreads them over the gRPC processes."""
    s.launch()

    def http_ready() -> bool:
        assert s.proc.poll() is None, s.log
        return http_get(f"http://{s.http_url}/v2/health/ready", 1.0)[0] == 200
    wait_for(http_ready, 120, lambda: "HTTP ready:\n" + s.log, every=0.01)
    failures = []
    for _ in range(8):
        client = grpcclient.InferenceServerClient(s.grpc_url)
        try:
            if not client.is_server_ready():
                failures.append("not ready")
        except InferenceServerException as e:
            failures.append(str(e))
        finally:
            client.close()
    return failures


@pytest.fixture(scope="module")
def hserver(tmp_path_factory):
    repo = tmp_path_factory.mktemp("hardening") / "models"
    add_fault_model(repo, "solo", count=1, batching=None)
    add_fault_model(repo, "other", count=1, batching=None)
    s = TritondServer(repo, FLAGS)
    s.grpc_on_ready = start_watching_grpc(s)
    with serving(s):
        yield s


def infer_http(s: TritondServer, model: str, **params):
    client = httpclient.InferenceServerClient(s.http_url, network_timeout=60)
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    try:
        return client.infer(model, [inp], parameters=params or None)
    finally:
        client.close()


def infer_grpc(s: TritondServer, model: str):
    client = grpcclient.InferenceServerClient(s.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    try:
        return client.infer(model, [inp], client_timeout=60)
    finally:
        client.close()


def test_grpc_serves_the_moment_http_says_ready(hserver):
    assert hserver.grpc_on_ready == []


def test_tritonserver_flags_are_noted_in_the_log(hserver):
    assert "'--grpc-infer-allocation-pool-size' is a tritonserver flag that tritond ignores" in hserver.log
    assert "--log-info" not in hserver.log


def test_the_model_is_not_ready_as_soon_as_its_request_failed(hserver):
    with pytest.raises(InferenceServerException) as e:
        infer_http(hserver, "solo", fault="exit")
    assert e.value.status() == "503" and "died (exit code 7)" in str(e.value)
    status, _ = http_get(f"http://{hserver.http_url}/v2/models/solo/ready", 2.0)
    assert status == 400


def test_requests_wait_for_a_restarting_instance_instead_of_404(hserver):
    infer_http(hserver, "solo")
    (pid,) = hserver.worker_pids("solo")
    results: list[object] = []

    def call(kind: str) -> None:
        try:
            results.append(infer_http(hserver, "solo") if kind == "http" else infer_grpc(hserver, "solo"))
        except InferenceServerException as e:
            results.append(e)

    os.kill(pid, signal.SIGKILL)
    # Once the broker has seen the death (readiness turns false at once), new requests queue for
    # the replacement; one sent before that may still reach the dead worker and fail with it.
    wait_for(lambda: http_get(f"http://{hserver.http_url}/v2/models/solo/ready", 2.0)[0] != 200, 30,
             "solo to be not ready", every=0.005)
    threads = [threading.Thread(target=call, args=(kind,)) for kind in ("http", "grpc") * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(results) == 8 and errors == [], [str(e) for e in errors]
    assert http_get(f"http://{hserver.http_url}/v2/models/solo/ready", 2.0)[0] == 200


@pytest.mark.parametrize("name", ["..", "x\0y", "n" * 300])
def test_model_names_that_are_paths_are_refused_over_http(hserver, name):
    client = httpclient.InferenceServerClient(hserver.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model(name)
    assert e.value.status() == "400"
    assert "model name must not contain path traversal characters" in str(e.value)


@pytest.mark.parametrize("name", ["..", "a/b", "x\0y", "n" * 300, "../other"])
def test_model_names_that_are_paths_are_refused_over_grpc(hserver, name):
    client = grpcclient.InferenceServerClient(hserver.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model(name)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "model name must not contain path traversal characters" in str(e.value)


@pytest.mark.parametrize("name", ["echo\nx", "echo\n", "x\ry", "a\x1b[2Jb", "a\x7f"])
def test_model_names_with_control_characters_are_refused_as_nul_is(hserver, name):
    """Refused for their form (400 / INVALID_ARGUMENT, as NUL), not looked up as a model."""
    shown = "".join(c.encode("unicode_escape").decode() if ord(c) < 32 or ord(c) == 127 else c for c in name)
    text = f"invalid model name '{shown}', model name must not contain control characters"
    expect_error(lambda: httpclient.InferenceServerClient(hserver.http_url).load_model(name), 400, text)
    expect_error(lambda: grpcclient.InferenceServerClient(hserver.grpc_url).load_model(name), 400, text,
                 protocol="grpc")
    assert http_get(f"http://{hserver.http_url}/v2/health/live")[0] == 200


def test_an_unparseable_grpc_message_is_invalid_argument_without_internals(hserver):
    with grpc.insecure_channel(hserver.grpc_url) as channel:
        for method in ("ModelInfer", "ServerLive", "RepositoryModelLoad"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff\xff\xff\xff\x0f", timeout=10)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == ("the request message could not be parsed as a protobuf message of "
                                         "the RPC's type")
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        (reply,) = list(stream(iter([b"\xff\xff\xff\xff\x0f"]), timeout=10))
        assert b"could not be parsed" in reply and b"class" not in reply
    assert grpcclient.InferenceServerClient(hserver.grpc_url).is_server_live()


def test_server_metadata_lists_only_extensions_that_work(hserver):
    for meta in (httpclient.InferenceServerClient(hserver.http_url).get_server_metadata()["extensions"],
                 list(grpcclient.InferenceServerClient(hserver.grpc_url).get_server_metadata().extensions)):
        assert meta == ["classification", "sequence", "model_repository", "model_repository(unload_dependents)",
                        "schedule_policy", "model_configuration", "binary_tensor_data", "parameters", "statistics",
                        "trace", "logging"]


def test_live_stays_true_while_the_broker_is_stopped(hserver):
    [broker] = hserver.role_pids("tritond.broker.main")
    client = grpcclient.InferenceServerClient(hserver.grpc_url)
    os.kill(broker, signal.SIGSTOP)
    try:
        time.sleep(BROKER_SILENCE_S + 1.5)        # every frontend has given the broker up by now (its timeout)
        assert http_get(f"http://{hserver.http_url}/v2/health/ready", 2.0)[0] == 400
        assert not client.is_server_ready()
        assert http_get(f"http://{hserver.http_url}/v2/health/live", 2.0)[0] == 200
        assert client.is_server_live()
    finally:
        os.kill(broker, signal.SIGCONT)
    wait_for(lambda: http_get(f"http://{hserver.http_url}/v2/health/ready", 2.0)[0] == 200, 30,
             "the server to be ready again")
    infer_http(hserver, "other")
