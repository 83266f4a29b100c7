"""Triton-mode traces of what a request leads to, through the real clients: a BLS call a Python
model makes with `trace=request.trace()` (traced as the request's child, with its `parent_id`,
as L0_trace's bls_simple checks), and requests on a gRPC stream (traced like unary ones)."""
from __future__ import annotations

import json
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, build_example_repository, serving, wait_for

BLS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(model_name="identity_fp32", requested_output_names=["OUTPUT0"],
                                             inputs=[x], trace=request.trace())
            out = pb_utils.get_output_tensor_by_name(call.exec(), "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
'''


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace_children")
    repo = build_example_repository(tmp / "models", ("identity_fp32",))
    (repo / "bls" / "1").mkdir(parents=True)
    (repo / "bls" / "1" / "model.py").write_text(BLS)
    (repo / "bls" / "config.pbtxt").write_text('''
name: "bls" backend: "python" max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
''')
    with serving(TritondServer(repo, [f"--trace-config=triton,file={tmp / 'trace.json'}",
                                      "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                                      "--trace-config=triton,log-frequency=1"])) as s:
        yield s, tmp


def traces(tmp: Path) -> list[dict]:
    return [r for path in sorted(tmp.glob("trace.json.*")) for r in json.loads(path.read_text())]


def heads_of(tmp: Path, request_id: str) -> list[dict]:
    return [r for r in traces(tmp) if r.get("request_id") == request_id and "model_name" in r]


def test_a_bls_call_with_the_requests_trace_is_its_child(traced):
    s, tmp = traced
    x = np.arange(4, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(x)
    out = httpclient.InferenceServerClient(s.http_url).infer("bls", [inp], request_id="via-bls")
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x)
    # the BLS call has no request id of its own (its trace has none, as in Triton)
    wait_for(lambda: heads_of(tmp, "via-bls"), 10, "the BLS model's request's trace")
    (parent,) = heads_of(tmp, "via-bls")
    assert parent["model_name"] == "bls" and "parent_id" not in parent
    wait_for(lambda: [r for r in traces(tmp) if r.get("parent_id") == parent["id"]], 10, "its child's trace")
    (child,) = [r for r in traces(tmp) if r.get("parent_id") == parent["id"]]
    assert child["model_name"] == "identity_fp32"
    stamps = [t["timestamps"][0]["name"] for t in traces(tmp) if t["id"] == child["id"] and "timestamps" in t]
    assert "COMPUTE_INPUT_END" in stamps


def test_a_request_on_a_grpc_stream_is_traced(traced):
    s, tmp = traced
    client = grpcclient.InferenceServerClient(s.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error or result))
    inp = grpcclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
    client.async_stream_infer("identity_fp32", [inp], request_id="streamed")
    assert not isinstance(got.get(timeout=30), Exception)
    client.stop_stream()
    wait_for(lambda: heads_of(tmp, "streamed"), 10, "the streamed request's trace")
    (head,) = heads_of(tmp, "streamed")
    stamps = [t["timestamps"][0]["name"] for t in traces(tmp) if t["id"] == head["id"] and "timestamps" in t]
    assert stamps[:2] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
    assert stamps[-2:] == ["GRPC_SEND_START", "GRPC_SEND_END"]
