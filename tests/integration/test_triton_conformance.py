"""Behaviours Triton's own qa suites check, through the real clients on one server: labels in
classification results (also through ensembles), ragged batching on ONNX with a batch input
and a batch output, the built-in identity backend, and HTTP bodies at the edges (a chunk
count cap, Transfer-Encoding with Content-Length, a deeply nested repository index body)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, serving

LABELS = "".join(f"label{i}\n" for i in range(8))
IDENTITY = '''name: "labeled"
backend: "identity"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 8 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8 ] label_filename: "labels.txt" }]
'''
ENSEMBLE = '''name: "%s"
platform: "ensemble"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 8 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8 ] %s }]
ensemble_scheduling { step [{ model_name: "labeled" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }] }
'''
RAGGED = '''name: "ragged"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "COUNTS" data_type: TYPE_INT32 dims: [ 1 ] }]
batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "COUNTS_IN" data_type: TYPE_INT32 source_input: "INPUT0" }]
batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUTPUT0" source_input: "INPUT0" }]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 5000000 }
'''


def _ragged_onnx(path) -> None:
    """OUTPUT0 = 2 * INPUT0 over the flattened batch; COUNTS = the batch input as a column."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT0"], ["OUTPUT0"]),
             helper.make_node("Constant", [], ["col"], value=helper.make_tensor("c", TensorProto.INT64, [2], [-1, 1])),
             helper.make_node("Reshape", ["COUNTS_IN", "col"], ["COUNTS"])]
    graph = helper.make_graph(
        nodes, "ragged",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1]),
         helper.make_tensor_value_info("COUNTS_IN", TensorProto.INT32, [-1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1]),
         helper.make_tensor_value_info("COUNTS", TensorProto.INT32, [-1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    repo = tmp_path_factory.mktemp("conformance")
    for name, config in (("labeled", IDENTITY), ("labeled_ensemble", ENSEMBLE % ("labeled_ensemble", "")),
                         ("own_labels", ENSEMBLE % ("own_labels", 'label_filename: "own.txt"')),
                         ("ragged", RAGGED)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "labeled" / "labels.txt").write_text(LABELS)
    (repo / "own_labels" / "own.txt").write_text("".join(f"own{i}\n" for i in range(8)))
    _ragged_onnx(repo / "ragged" / "1" / "model.onnx")
    with serving(TritondServer(repo)) as s:
        yield s


def _classes(result, name="OUTPUT0") -> list[str]:
    return [x.decode() for x in result.as_numpy(name).reshape(-1)]


@pytest.mark.parametrize("model, label", [("labeled", "label"), ("labeled_ensemble", "label"),
                                          ("own_labels", "own")])
def test_classification_results_carry_labels(conformance, model, label):
    x = np.array([[0, 5, 1, 7, 2, 3, 4, 6]], np.float32)
    h = httpclient.InferenceServerClient(conformance.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 8], "FP32")
    inp.set_data_from_numpy(x)
    out = h.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert _classes(out) == [f"7.000000:3:{label}3", f"6.000000:7:{label}7"]
    g = grpcclient.InferenceServerClient(conformance.grpc_url)
    ginp = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
    ginp.set_data_from_numpy(x)
    out = g.infer(model, [ginp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert _classes(out) == [f"7.000000:3:{label}3"]


def test_requests_of_different_shapes_batch_into_one_ragged_execution(conformance):
    results = {}

    def send(n: int) -> None:
        inp = httpclient.InferInput("INPUT0", [1, n], "FP32")
        inp.set_data_from_numpy(np.full((1, n), n, np.float32))
        client = httpclient.InferenceServerClient(conformance.http_url)   # one per thread (gevent)
        results[n] = client.infer("ragged", [inp])
        client.close()
    threads = [threading.Thread(target=send, args=(n,)) for n in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in (3, 5):
        np.testing.assert_array_equal(results[n].as_numpy("OUTPUT0"), np.full((1, n), 2 * n, np.float32))
        np.testing.assert_array_equal(results[n].as_numpy("COUNTS"), [[n]])
    h = httpclient.InferenceServerClient(conformance.http_url)
    stats = h.get_inference_statistics("ragged")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (2, 1)


def _raw(server, request: bytes) -> bytes:
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_a_chunked_body_of_more_than_65536_chunks_is_refused(conformance):
    head = (b"POST /v2/models/labeled/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    answer = _raw(conformance, head + b"1\r\nA\r\n" * 65537 + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger HTTP chunks." \
        in answer
    # at the cap the body is taken (and then judged as a raw request for the model)
    answer = _raw(conformance, head + b"1\r\nA\r\n" * 65536 + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"non-empty chunks" not in answer


def test_chunked_with_content_length_is_decoded_and_the_connection_closed(conformance):
    """RFC 9112 section 6.3: the chunks win over Content-Length, and the server closes the
    connection after answering (no second request may follow on it)."""
    body = np.arange(8, dtype=np.float32).tobytes()
    chunked = f"{len(body):X}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    request = (b"POST /v2/models/labeled/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
               b"Transfer-Encoding: chunked\r\nContent-Length: " + str(len(chunked)).encode() + b"\r\n\r\n" + chunked)
    answer = _raw(conformance, request + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(body)
    assert answer.count(b"HTTP/1.1 ") == 1 and b"connection: close" in answer.lower()


def test_a_deeply_nested_ready_value_is_not_a_boolean(conformance):
    depth = 250000
    r = requests.post(f"http://{conformance.http_url}/v2/repository/index",
                      data='{"ready":' + "[" * depth + "true" + "]" * depth + "}")
    assert (r.status_code, r.json()) == (400, {"error": "Invalid value for 'ready': expected a boolean"})
