"""A Python model's response parameters (`InferenceResponse(parameters=...)`), as Triton's python
backend carries them (L0_backend_python/parameters): in the HTTP and gRPC responses, in each
response of a decoupled model beside gRPC's `triton_final_response`, and back to a BLS caller."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, serving

IO = """
backend: "python"
max_batch_size: 0
input [{ name: "PARAMS" data_type: TYPE_STRING dims: [1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]
"""

ECHO = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


def answer(request):
    params = json.loads(pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy()[0])
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([len(params)], np.int32))],
                                      parameters=params)


class TritonPythonModel:
    \"\"\"Answers with the parameters its PARAMS input holds (as JSON text).\"\"\"

    def execute(self, requests):
        if pb_utils.using_decoupled_model_transaction_policy(self.config):
            for request in requests:
                sender = request.get_response_sender()
                sender.send(answer(request))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [answer(r) for r in requests]

    def initialize(self, args):
        self.config = json.loads(args["model_config"])
"""

CALLER = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Calls `echo` with its own input and answers with what echo's response parameters were.\"\"\"

    def execute(self, requests):
        out = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="echo", requested_output_names=["OUT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "PARAMS")])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out.append(pb_utils.InferenceResponse(response.output_tensors(),
                                                  parameters=json.loads(response.parameters())))
        return out
"""

PARAMS = {"bool": True, "str": "Hello World!", "int": 1024}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("response_parameters")
    for name, code, extra in (("echo", ECHO, ""), ("echo_decoupled", ECHO, "model_transaction_policy { decoupled: true }"),
                              ("caller", CALLER, "")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(IO + extra)
        (root / name / "1" / "model.py").write_text(code)
    with serving(TritondServer(root)) as s:
        yield s


def params_input(module, params: dict):
    inp = module.InferInput("PARAMS", [1], "BYTES")
    inp.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=object))
    return inp


@pytest.mark.parametrize("model", ["echo", "caller"])
@pytest.mark.parametrize("params", [PARAMS, {}, {"many_elements": False}])
def test_response_parameters_reach_http_and_grpc_clients(server, model, params):
    result = httpclient.InferenceServerClient(server.http_url).infer(model, [params_input(httpclient, params)])
    assert result.get_response().get("parameters", {}) == params
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        response = c.infer(model, [params_input(grpcclient, params)]).get_response(as_json=True)
    got = {k: next(iter(v.values())) for k, v in response.get("parameters", {}).items()}
    assert got == {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in params.items()}


def test_each_decoupled_response_carries_its_parameters(server):
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("echo_decoupled", [params_input(grpcclient, PARAMS)],
                             enable_empty_final_response=True)
        first, error = results.get(timeout=30)
        last, _ = results.get(timeout=30)
        c.stop_stream()
    assert error is None
    params = first.get_response().parameters
    assert {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in params.items()} == {
        **PARAMS, "triton_final_response": False}
    assert set(last.get_response().parameters) == {"triton_final_response"}


def test_a_float_response_parameter_fails_the_request_as_tritons_does(server):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(Exception, match="Expect parameters values to have type bool/int/str, found type <class 'float'>"):
        client.infer("echo", [params_input(httpclient, {"int": 2, "float": 0.5})])
