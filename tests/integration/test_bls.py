"""BLS (business-logic scripting) from Python models, through tritonclient: `exec` and
`async_exec` into Python, ONNX and ensemble models, errors carried back with their code and
message, concurrent `async_exec` calls of one execute() that overlap (the callee batches
them), many concurrent requests fanning into a batched model, and calls that would deadlock
(a model calling itself, or a cycle of single-instance models) refused instead of hanging, and a
decoupled model's async execute() calling while new requests reach it."""
from __future__ import annotations

import concurrent.futures as futures
import queue
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, http_get, serving, wait_for

CALLER = '''
import asyncio, json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


def hold(gate):
    """Say "started" in the directory `gate`, then wait for "open" there."""
    open(os.path.join(gate, "started"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < deadline:
        time.sleep(0.01)


def request_for(target, x, params):
    if target == "add_sub_onnx":
        batch = x.reshape(1, -1)
        inputs = [pb_utils.Tensor("INPUT0", batch), pb_utils.Tensor("INPUT1", batch)]
    else:
        inputs = [pb_utils.Tensor("INPUT0", x)]
    names = ["OUTPUT0", "ERROR"] if target.startswith("bls_call") else ["OUTPUT0"]
    return pb_utils.InferenceRequest(model_name=target, inputs=inputs, requested_output_names=names,
                                     parameters=params)


def answer(response, shape):
    """OUTPUT0 and ERROR ("<code>|<message>", empty on success) of a BLS response."""
    error = ""
    out = np.zeros(0, np.float32)
    nested = None if response.has_error() else pb_utils.get_output_tensor_by_name(response, "ERROR")
    if response.has_error():
        error = f"{response.error().code().name}|{response.error().message()}"
    elif nested is not None and nested.as_numpy()[0]:
        error = nested.as_numpy()[0].decode()
    else:
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy().reshape(shape)
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.astype(np.float32)),
                                       pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=object))])


class TritonPythonModel:
    """Calls the model named by the request parameter "target" with "mode" exec or async
    (its own parameter "then" becomes the callee's "target"; "gate" holds it first)."""

    async def execute(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if "gate" in params:
                hold(params["gate"])
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = request_for(params["target"], x, {"target": params["then"]} if "then" in params else {})
            if params.get("mode") == "async":
                response = await call.async_exec()
            else:
                response = call.exec()
            out.append(answer(response, x.shape))
        return out
'''

FANOUT = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Four concurrent async_exec calls into batch_reporter; returns the batch size each saw."""

    async def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().reshape(1, -1)
            calls = [pb_utils.InferenceRequest(model_name="batch_reporter", inputs=[pb_utils.Tensor("INPUT0", x + i)],
                                               requested_output_names=["OUTPUT0", "BATCH_SIZE"]).async_exec()
                     for i in range(4)]
            sizes = []
            for i, r in enumerate(await asyncio.gather(*calls)):
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
                got = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                if not np.array_equal(got, x + i):
                    raise pb_utils.TritonModelException(f"call {i} got another call's output")
                sizes.append(int(pb_utils.get_output_tensor_by_name(r, "BATCH_SIZE").as_numpy()[0, 0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("BATCH_SIZES", np.array(sizes, np.int32))]))
        return out
'''

FORWARD = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Forwards each request to batch_reporter with exec(); returns its output and batch size."""

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().reshape(1, -1)
            r = pb_utils.InferenceRequest(model_name="batch_reporter", inputs=[pb_utils.Tensor("INPUT0", x)],
                                          requested_output_names=["OUTPUT0", "BATCH_SIZE"]).exec()
            if r.has_error():
                out.append(pb_utils.InferenceResponse(error=r.error()))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy().reshape(-1)),
                pb_utils.Tensor("BATCH_SIZE", pb_utils.get_output_tensor_by_name(r, "BATCH_SIZE").as_numpy().reshape(1)),
            ]))
        return out
'''

SLOW_ECHO = '''
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: answers each request with its input, once, after a second."""

    async def execute(self, requests):
        await asyncio.sleep(1)
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

STREAM_CALLER = '''
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: each request calls slow_echo with `await async_exec(decoupled=True)` and sends
    on what comes back; execute() returns at once and the calls run on in the background."""

    async def call(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        call = pb_utils.InferenceRequest(model_name="slow_echo", inputs=[pb_utils.Tensor("INPUT0", x)],
                                         requested_output_names=["OUTPUT0"])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(error=response.error()))
            elif response.output_tensors():
                sender.send(pb_utils.InferenceResponse(response.output_tensors()))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self.call(r) for r in requests))
'''

FAILING = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("failing says no", pb_utils.TritonError.INVALID_ARG))
                for _ in requests]
'''

ENSEMBLE = '''
name: "ens_identity"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "identity_fp32" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
'''


def python_model(root: Path, name: str, code: str, outputs: list[tuple[str, str, str]], count: int = 1,
                 decoupled: bool = False) -> None:
    (root / name / "1").mkdir(parents=True)
    tensors = ['input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]'] + [
        f'output [ {{ name: "{n}" data_type: {t} dims: [ {d} ] }} ]' for n, t, d in outputs]
    (root / name / "config.pbtxt").write_text("\n".join(
        [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0", *tensors,
         f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]",
         f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}"]))
    (root / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(example_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("bls")
    for name in ("batch_reporter", "identity_fp32", "add_sub_onnx"):
        shutil.copytree(example_repo / name, root / name)
    answer = [("OUTPUT0", "TYPE_FP32", "-1"), ("ERROR", "TYPE_STRING", "1")]
    for name in ("bls_call", "bls_call2"):
        python_model(root, name, CALLER, answer)
    python_model(root, "bls_fanout", FANOUT, [("BATCH_SIZES", "TYPE_INT32", "4")])
    python_model(root, "bls_forward", FORWARD, [("OUTPUT0", "TYPE_FP32", "-1"), ("BATCH_SIZE", "TYPE_INT32", "1")],
                 count=4)
    python_model(root, "failing", FAILING, [("OUTPUT0", "TYPE_FP32", "-1")])
    for name, code in (("slow_echo", SLOW_ECHO), ("bls_stream_caller", STREAM_CALLER)):
        python_model(root, name, code, [("OUTPUT0", "TYPE_FP32", "-1")], decoupled=True)
    (root / "ens_identity" / "1").mkdir(parents=True)
    (root / "ens_identity" / "config.pbtxt").write_text(ENSEMBLE)
    with serving(TritondServer(root)) as s:
        yield s


@pytest.fixture
def client(server):
    return httpclient.InferenceServerClient(server.http_url, network_timeout=120)


def call(client, model: str, x: np.ndarray, **params):
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], parameters=params or None)


def via(client, x, **params) -> tuple[np.ndarray, str]:
    result = call(client, "bls_call", x, **params)
    return result.as_numpy("OUTPUT0"), result.as_numpy("ERROR")[0].decode()


@pytest.mark.parametrize("mode", ["exec", "async"])
@pytest.mark.parametrize("target, factor", [("identity_fp32", 1), ("add_sub_onnx", 2), ("ens_identity", 1)])
def test_calls_python_onnx_and_ensemble_models(client, mode, target, factor):
    x = np.arange(16, dtype=np.float32)
    out, error = via(client, x, target=target, mode=mode)
    assert error == ""
    np.testing.assert_array_equal(out, factor * x)


@pytest.mark.parametrize("mode", ["exec", "async"])
def test_large_tensors_travel_both_ways(client, mode):
    x = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)   # 1.2 MB: through shared memory
    out, error = via(client, x, target="identity_fp32", mode=mode)
    assert error == ""
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("mode", ["exec", "async"])
@pytest.mark.parametrize("target, expected", [
    ("failing", "INVALID_ARG|failing says no"),
    ("no_such_model", "INVALID_ARG|Request for unknown model: 'no_such_model' is not found"),
])
def test_callee_errors_reach_the_caller(client, mode, target, expected):
    out, error = via(client, np.ones(16, np.float32), target=target, mode=mode)
    assert error == expected and out.size == 0


def test_a_callee_execution_error_reaches_the_caller(client):
    out, error = via(client, np.ones(3, np.float32), target="add_sub_onnx")
    assert "INPUT1" in error and out.size == 0


def test_concurrent_async_exec_calls_overlap(client):
    sizes = call(client, "bls_fanout", np.arange(8, dtype=np.float32)).as_numpy("BATCH_SIZES")
    assert list(sizes) == [4, 4, 4, 4], "the four calls reached batch_reporter together"


def test_many_requests_fan_into_a_batched_model(server, client):
    before = client.get_inference_statistics("batch_reporter")["model_stats"][0]

    def one(i):
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        x = np.full(5, i, dtype=np.float32)
        r = call(c, "bls_forward", x)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
        return int(r.as_numpy("BATCH_SIZE")[0])

    with futures.ThreadPoolExecutor(16) as pool:
        sizes = list(pool.map(one, range(32)))
    after = client.get_inference_statistics("batch_reporter")["model_stats"][0]
    served = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    executions = after["execution_count"] - before["execution_count"]
    assert served == 32
    assert max(sizes) > 1 and executions < 32, "batch_reporter batched calls from several callers"


def test_a_model_calling_itself_is_refused_not_deadlocked(client):
    out, error = via(client, np.ones(4, np.float32), target="bls_call", then="identity_fp32")
    assert error.startswith("UNAVAILABLE|BLS request from model 'bls_call' to model 'bls_call' would deadlock")
    out, error = via(client, np.ones(4, np.float32), target="identity_fp32")
    assert error == "" and out.tolist() == [1, 1, 1, 1]


def test_a_cycle_of_calls_is_refused_not_deadlocked(client):
    # bls_call -> bls_call2 -> bls_call: bls_call's only instance is the one waiting.
    out, error = via(client, np.ones(4, np.float32), target="bls_call2", then="bls_call")
    assert "BLS request from model 'bls_call2' to model 'bls_call' would deadlock" in error


def test_a_chain_without_a_cycle_is_served(client):
    out, error = via(client, np.arange(4, dtype=np.float32), target="bls_call2", then="identity_fp32")
    assert error == "" and out.tolist() == [0, 1, 2, 3]


def test_a_decoupled_async_caller_takes_requests_while_its_calls_wait(server):
    """Four requests on one stream reach bls_stream_caller while the calls of the first ones
    still wait on slow_echo: each call and each request is answered (the worker's loop and the
    calls share its socket, so a request arriving mid-call is neither lost nor read twice)."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        for i in range(4):
            inp = grpcclient.InferInput("INPUT0", [3], "FP32")
            inp.set_data_from_numpy(np.full(3, i, np.float32))
            c.async_stream_infer("bls_stream_caller", [inp], request_id=str(i))
        answers = {}
        for _ in range(4):
            result, error = results.get(timeout=30)
            assert error is None, error
            answers[result.get_response().id] = result.as_numpy("OUTPUT0").tolist()
        c.stop_stream()
    assert answers == {str(i): [float(i)] * 3 for i in range(4)}


def test_calls_made_while_the_server_drains_are_served(server, tmp_path):
    """Runs last: it stops the module's server. A request in flight when SIGTERM arrives may
    still call other models; only new requests from clients are refused."""
    gate = tmp_path / "gate"
    gate.mkdir()
    x = np.arange(4, dtype=np.float32)
    with futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(lambda: via(httpclient.InferenceServerClient(server.http_url, network_timeout=120), x,
                                      target="identity_fp32", gate=str(gate)))
        wait_for((gate / "started").exists, 60, "the request to reach the gate", every=0.02)
        server.send_signal(signal.SIGTERM)
        wait_for(lambda: http_get(f"http://{server.http_url}/v2/health/ready")[0] != 200, 60,
                 "the server to stop being ready", every=0.02)
        (gate / "open").touch()
        out, error = fut.result(timeout=60)
    assert error == "" and out.tolist() == x.tolist()
