"""The HTTP/REST API against a real server on the example repository, through tritonclient.

Malformed bodies that tritonclient would never send go through http.client. Status codes
and messages are Triton's (TRITON-SPEC.md §0-§1).
"""
from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from conftest import expect_error, http_get

# Triton's list less what this server does not do: the sequence batcher, trace and log settings
# that take effect, CUDA shared memory on a host without a GPU.
EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging",
]
STATS_MODEL = "mlp_onnx_nobatch"   # only test_statistics_exact_counts infers on it


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=120.0)
    yield c
    c.close()


def request(server, method: str, path: str, body: bytes = b"", headers: dict | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP exchange: (status, lower-cased headers, body)."""
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def infer_json(server, model: str, doc: dict | bytes, headers: dict | None = None) -> tuple[int, dict]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    status, _, data = request(server, "POST", f"/v2/models/{model}/infer", body, headers)
    return status, json.loads(data) if data else {}


def fp32_input(name: str, array: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    t = httpclient.InferInput(name, list(array.shape), "FP32")
    t.set_data_from_numpy(array, binary_data=binary)
    return t


def onnx_reference(repo, model: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# ------------------------------------------------------------------------- health and metadata

def test_health(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp_onnx")
    assert client.is_model_ready("mlp_onnx", "1")
    assert not client.is_model_ready("mlp_onnx", "2")
    status, headers, body = request(server, "GET", "/v2/health/live")
    assert (status, body) == (200, b"")
    status, _, body = request(server, "GET", "/v2/models/mlp_onnx/versions/2/ready")
    assert (status, json.loads(body)) == (400, {"error": "Model version not ready"})
    status, _, body = request(server, "GET", "/v2/models/nope/ready")
    assert (status, json.loads(body)) == (400, {"error": "Request for unknown model: 'nope' is not found"})


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert meta["extensions"] == EXTENSIONS
    assert isinstance(meta["version"], str) and meta["version"]


@pytest.mark.parametrize("version", ["", "1"])
def test_model_metadata(client, version):
    meta = client.get_model_metadata("add_sub_onnx", version)
    assert meta == {
        "name": "add_sub_onnx", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                    {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]}],
    }
    meta = client.get_model_metadata("identity_fp32", version)
    assert meta["platform"] == "python"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]


def test_model_metadata_errors(client):
    expect_error(lambda: client.get_model_metadata("nope"), 400,
                 "Request for unknown model: 'nope' is not found", exact=True)
    expect_error(lambda: client.get_model_metadata("mlp_onnx", "7"), 404,
                 "Request for unknown model: 'mlp_onnx' version 7 is not found", exact=True)


def test_model_config_fields(client):
    cfg = client.get_model_config("mlp_onnx")
    assert cfg["name"] == "mlp_onnx"
    assert cfg["max_batch_size"] == 64
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["input"][0]["dims"] == [256]
    assert cfg["output"][0]["dims"] == [256]
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["instance_group"][0]["count"] == 1
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 200
    assert client.get_model_config("mlp_onnx", "1") == cfg
    cfg = client.get_model_config("string_upper")
    assert cfg["input"][0]["data_type"] == "TYPE_STRING"
    assert cfg["max_batch_size"] == 0
    assert "dynamic_batching" not in cfg


def test_auto_completed_config(client):
    cfg = client.get_model_config("add_sub_onnx")
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [16]), ("OUTPUT1", "TYPE_FP32", [16])]
    assert all(isinstance(d, int) for d in cfg["input"][0]["dims"])


# ------------------------------------------------------------------------- inference

@pytest.mark.parametrize("binary", [True, False])
def test_mlp_matches_onnxruntime(client, example_repo, binary):
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer("mlp_onnx", [fp32_input("INPUT0", x, binary)], outputs=out)
    (expected,) = onnx_reference(example_repo, "mlp_onnx", {"INPUT0": x})
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-5, atol=1e-5)
    assert result.get_response()["model_version"] == "1"


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub(client, example_repo, binary):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 16)).astype(np.float32)
    b = rng.standard_normal((2, 16)).astype(np.float32)
    result = client.infer("add_sub_onnx", [fp32_input("INPUT0", a, binary), fp32_input("INPUT1", b, binary)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    ref = onnx_reference(example_repo, "add_sub_onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ref[0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ref[1])


def test_requested_output_subset(client):
    a = np.ones((1, 16), np.float32)
    b = np.full((1, 16), 2, np.float32)
    result = client.infer("add_sub_onnx", [fp32_input("INPUT0", a), fp32_input("INPUT1", b)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_python_identity_json(server):
    status, doc = infer_json(server, "identity_fp32", {
        "id": "req-7", "inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]}]})
    assert status == 200, doc
    assert doc == {"id": "req-7", "model_name": "identity_fp32", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.5]}]}


def test_request_id_echoed(client):
    x = np.arange(4, dtype=np.float32)
    result = client.infer("identity_fp32", [fp32_input("INPUT0", x)], request_id="my-id-1")
    assert result.get_response()["id"] == "my-id-1"
    result = client.infer("identity_fp32", [fp32_input("INPUT0", x)])
    assert "id" not in result.get_response()


def dtypes_inputs(fp16_binary: bool = True) -> tuple[list[httpclient.InferInput], dict[str, np.ndarray]]:
    values = {
        "FP32": np.array([1.5, -2.25, 3e38], np.float32),
        "INT64": np.array([-(1 << 62), 0, (1 << 62) + 5], np.int64),
        "BOOL": np.array([True, False, True]),
        "FP16": np.array([0.5, -1.0, 65504.0], np.float16),
        "BYTES": np.array([b"a", "\u00e9t\u00e9".encode(), b""], dtype=np.object_),
    }
    inputs = []
    for dt, arr in values.items():
        t = httpclient.InferInput(f"INPUT_{dt}", [3], dt)
        t.set_data_from_numpy(arr, binary_data=True if dt == "FP16" and fp16_binary else False)
        inputs.append(t)
    return inputs, values


@pytest.mark.parametrize("binary_out", [True, False])
def test_datatypes_round_trip(client, binary_out):
    inputs, values = dtypes_inputs()
    outputs = [httpclient.InferRequestedOutput(f"OUTPUT_{dt}", binary_data=binary_out or dt == "FP16")
               for dt in values]
    result = client.infer("dtypes_py", inputs, outputs=outputs)
    for dt, arr in values.items():
        got = result.as_numpy(f"OUTPUT_{dt}")
        assert result.get_output(f"OUTPUT_{dt}")["datatype"] == dt
        if dt == "BYTES" and not binary_out:   # JSON strings come back as str
            got = np.array([x.encode() for x in got], dtype=np.object_)
        np.testing.assert_array_equal(got, arr, err_msg=dt)


def test_all_binary_inputs_and_default_binary_output(client):
    inputs, values = dtypes_inputs()
    for t, arr in zip(inputs, values.values()):
        t.set_data_from_numpy(arr, binary_data=True)
    result = client.infer("dtypes_py", inputs)   # no outputs listed: tritonclient asks for binary_data_output
    for o in result.get_response()["outputs"]:
        assert "binary_data_size" in o["parameters"] and "data" not in o
    for dt, arr in values.items():
        np.testing.assert_array_equal(result.as_numpy(f"OUTPUT_{dt}"), arr)


def test_non_utf8_bytes_output_in_json(client, server):
    """A BYTES output that is not UTF-8, asked for as JSON, is written as the model made it (as
    Triton writes it, escaped but not re-encoded): tritonclient refuses that body instead of
    handing back altered strings (qa/L0_string_io)."""
    inputs, values = dtypes_inputs()
    raw = np.array([b"\xff\xfe\x00\"\\\n", b"ok", "\u00e9".encode()], dtype=np.object_)
    for t, arr in zip(inputs, values.values()):
        t.set_data_from_numpy(raw if t.name() == "INPUT_BYTES" else arr, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT_BYTES", binary_data=False)]
    expect_error(lambda: client.infer("dtypes_py", inputs, outputs=outputs),
                 text="Failed to encode using UTF-8. Please use binary_data=True")
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    headers = {"Inference-Header-Content-Length": str(json_size)} if json_size is not None else {}
    status, _, data = request(server, "POST", "/v2/models/dtypes_py/infer", body, headers)
    assert status == 200, data
    assert b'"data":["\xff\xfe\\u0000\\"\\\\\\n","ok","\xc3\xa9"]' in data, data


@pytest.mark.parametrize("shape", [[1, 0], [3, 0]])
def test_empty_output_with_a_zero_in_a_later_dimension(client, shape):
    """An output with no elements but more than one dimension comes back with its shape
    (qa/L0_infer_zero)."""
    t = fp32_input("INPUT0", np.zeros(shape, np.float32))
    result = client.infer("identity_dyn", [t])
    assert result.get_output("OUTPUT0")["shape"] == shape
    assert result.as_numpy("OUTPUT0").shape == tuple(shape)


def test_fp16_json_rejected(client):
    inputs, _ = dtypes_inputs(fp16_binary=False)
    expect_error(lambda: client.infer("dtypes_py", inputs), 400,
                 "receiving FP16 data via JSON is not supported. Please use the binary data format for input "
                 "INPUT_FP16", exact=True)


def test_binary_data_output_parameter(server):
    doc = {"parameters": {"binary_data_output": True},
           "inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    status, headers, body = request(server, "POST", "/v2/models/identity_fp32/infer", json.dumps(doc).encode())
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    head = json.loads(body[:n])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 12}
    np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32), [1, 2, 3])
    doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]
    status, headers, body = request(server, "POST", "/v2/models/identity_fp32/infer", json.dumps(doc).encode())
    assert status == 200 and headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    assert json.loads(body)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_per_output_binary_data(client):
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = client.infer("add_sub_onnx", [fp32_input("INPUT0", x), fp32_input("INPUT1", x)], outputs=outputs)
    o0, o1 = result.get_response()["outputs"]
    assert o0["parameters"]["binary_data_size"] == 128 and "data" not in o0
    assert o1["data"] == [0.0] * 32
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)


def test_bytes_model(client):
    t = httpclient.InferInput("INPUT0", [3], "BYTES")
    t.set_data_from_numpy(np.array(["abc", "Straße", ""], dtype=np.object_), binary_data=False)
    result = client.infer("string_upper", [t], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
                                                         httpclient.InferRequestedOutput("OUTPUT1")])
    assert list(result.as_numpy("OUTPUT0")) == ["ABC", "STRASSE", ""]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [3, 6, 0])


def test_classification(client):
    x = np.zeros((2, 16), np.float32)
    x[0, [3, 7, 11]] = [5.0, 9.0, 7.0]
    x[1, [0, 1]] = [2.0, 1.0]
    zeros = np.zeros_like(x)
    result = client.infer("add_sub_onnx", [fp32_input("INPUT0", x), fp32_input("INPUT1", zeros)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 3]
    labels = result.as_numpy("OUTPUT0")
    assert [x.decode() for x in labels[0]] == ["9.000000:7", "7.000000:11", "5.000000:3"]
    assert [x.decode().split(":")[1] for x in labels[1][:2]] == ["0", "1"]


def test_classification_of_a_row_over_a_million_elements_is_refused(client):
    """Triton bounds the work of one classification at 1,000,000 elements per batch row
    (qa/L0_parameters class_count_test)."""
    wanted = [httpclient.InferRequestedOutput("OUTPUT0", class_count=5)]
    big = fp32_input("INPUT0", np.ones((1, 1_000_001), np.float32))
    expect_error(lambda: client.infer("identity_dyn", [big], outputs=wanted), 400,
                 "classification output tensor too large", exact=True)
    x = np.zeros((1, 1_000_000), np.float32)
    x[0, 999_999] = 1.0
    labels = client.infer("identity_dyn", [fp32_input("INPUT0", x)], outputs=wanted).as_numpy("OUTPUT0")
    assert labels[0][0].decode() == "1.000000:999999"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression(client, algorithm):
    x = np.arange(64, dtype=np.float32)
    result = client.infer("identity_fp32", [fp32_input("INPUT0", x)], request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_raw(server, algorithm):
    doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    body = gzip.compress(doc) if algorithm == "gzip" else zlib.compress(doc)
    status, headers, data = request(server, "POST", "/v2/models/identity_fp32/infer", body,
                                    {"Content-Encoding": algorithm, "Accept-Encoding": f"identity;q=0.5, {algorithm}"})
    assert status == 200 and headers["content-encoding"] == algorithm
    plain = gzip.decompress(data) if algorithm == "gzip" else zlib.decompress(data)
    assert json.loads(plain)["outputs"][0]["data"] == [1.0, 2.0]


def test_corrupt_compressed_body(server):
    doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()
    for body in (gzip.compress(doc)[:-12], b"not gzip at all"):
        status, _, data = request(server, "POST", "/v2/models/identity_fp32/infer", body, {"Content-Encoding": "gzip"})
        assert status == 400 and json.loads(data)["error"].startswith("failed to decompress the request body")


def test_raw_binary_request(server, example_repo):
    x = np.arange(5, dtype=np.float32)
    status, headers, body = request(server, "POST", "/v2/models/identity_fp32/infer", x.tobytes(),
                                    {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    assert json.loads(body[:n])["outputs"][0]["shape"] == [5]
    np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32), x)
    # A batching model gets batch 1 prepended.
    x = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    status, headers, body = request(server, "POST", "/v2/models/mlp_onnx/infer", x.tobytes(),
                                    {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    assert json.loads(body[:n])["outputs"][0]["shape"] == [1, 256]
    (expected,) = onnx_reference(example_repo, "mlp_onnx", {"INPUT0": x.reshape(1, 256)})
    np.testing.assert_allclose(np.frombuffer(body[n:], np.float32).reshape(1, 256), expected, rtol=1e-5, atol=1e-5)


def test_raw_binary_request_errors(server):
    status, doc = infer_json(server, "add_sub_onnx", b"\0" * 64, {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert doc["error"] == ("[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
                            "but got 2 inputs in 'add_sub_onnx' model configuration")
    status, doc = infer_json(server, "identity_fp32", b"\0" * 6, {"Inference-Header-Content-Length": "0"})
    assert (status, doc["error"]) == (400, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
                                           "for model 'identity_fp32'. Expected 4, got 6")


def test_large_tensors_round_trip(client):
    """4 MiB in and out: the bytes travel through shared memory between processes."""
    x = np.random.default_rng(4).standard_normal(1 << 20).astype(np.float32)
    result = client.infer("identity_fp32", [fp32_input("INPUT0", x)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    y = np.random.default_rng(5).standard_normal((64, 1 << 14)).astype(np.float32)
    result = client.infer("identity_dyn", [fp32_input("INPUT0", y)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), y)


def test_aio_client(server, example_repo):
    async def run() -> list[np.ndarray]:
        c = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            assert await c.is_server_ready()
            assert (await c.get_model_metadata("mlp_onnx"))["name"] == "mlp_onnx"
            xs = [np.full((1, 256), i, np.float32) for i in range(4)]
            results = await asyncio.gather(*[
                c.infer("mlp_onnx", [fp32_input("INPUT0", x)]) for x in xs])
            return xs, [r.as_numpy("OUTPUT0") for r in results]
        finally:
            await c.close()
    xs, outs = asyncio.run(run())
    for x, out in zip(xs, outs):
        (expected,) = onnx_reference(example_repo, "mlp_onnx", {"INPUT0": x})
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_two_models_concurrently(server, example_repo):
    errors: list[BaseException] = []
    x = np.random.default_rng(6).standard_normal((2, 256)).astype(np.float32)
    (expected,) = onnx_reference(example_repo, "mlp_onnx", {"INPUT0": x})

    def worker(model: str) -> None:
        c = httpclient.InferenceServerClient(server.http_url)
        try:
            for i in range(10):
                if model == "mlp_onnx":
                    out = c.infer(model, [fp32_input("INPUT0", x)]).as_numpy("OUTPUT0")
                    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
                else:
                    v = np.full(8, i, np.float32)
                    np.testing.assert_array_equal(c.infer(model, [fp32_input("INPUT0", v)]).as_numpy("OUTPUT0"), v)
        except BaseException as e:
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(m,)) for m in ("mlp_onnx", "identity_fp32") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ------------------------------------------------------------------------- errors

F16 = list(range(16))


@pytest.mark.parametrize("model, doc, status, message", [
    ("nope", {"inputs": []}, 400, "Request for unknown model: 'nope' is not found"),
    ("identity_fp32", {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}, 400,
     "unexpected inference input 'X' for model 'identity_fp32'"),
    ("add_sub_onnx", {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": F16}]}, 400,
     "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub_onnx'. Got input(s) "
     "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
    ("identity_fp32", {"id": "r1", "inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32", "data": [1, 2]}]},
     400, "[request id: r1] inference input 'INPUT0' data-type is 'INT32', but model 'identity_fp32' expects 'FP32'"),
    ("add_sub_onnx", {"inputs": [{"name": n, "shape": [1, 15], "datatype": "FP32", "data": F16[:15]}
                                 for n in ("INPUT0", "INPUT1")]}, 400,
     "[request id: <id_unknown>] unexpected shape for input 'INPUT1' for model 'add_sub_onnx'. Expected [-1,16], "
     "got [1,15]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
     "prepended to each input shape. If you want to specify the full shape including the batch dim in your input "
     "dims config, try setting max_batch_size to zero. See the model configuration docs for more info on "
     "max_batch_size."),
    ("add_sub_onnx", {"inputs": [{"name": n, "shape": [9, 16], "datatype": "FP32", "data": F16 * 9}
                                 for n in ("INPUT0", "INPUT1")]}, 400,
     "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub_onnx'"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}, 400,
     "Failed to parse 'data' field: shape does not match true shape"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1, 2]}]}, 400,
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ("identity_fp32", {"parameters": {"triton_foo": 1},
                       "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}, 400,
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1],
                                   "parameters": {"binary_data_size": 4}}]}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32"}]}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But no field is set"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4}}]}, 400,
     "must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' when passing "
     "inputs in binary data format"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [-1], "datatype": "FP32", "data": [1]}]}, 500,
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("identity_fp32", {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "outputs": [{"name": "NOPE"}]}, 400,
     "unexpected inference output 'NOPE' for model 'identity_fp32'"),
    ("mlp_onnx", {"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32", "data": [0] * 256}]}
     | {"id": 3}, 400, "Unable to parse 'id'"),
])
def test_infer_error(server, model, doc, status, message):
    got_status, body = infer_json(server, model, doc)
    assert (got_status, body) == (status, {"error": message})


def test_version_errors(server):
    doc = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
    status, body = infer_json(server, "identity_fp32/versions/4", doc)
    assert (status, body) == (404, {"error": "Request for unknown model: 'identity_fp32' version 4 is not found"})


def test_byte_size_mismatch(client):
    t = httpclient.InferInput("INPUT0", [3], "FP32")
    t.set_data_from_numpy(np.zeros(3, np.float32))
    t.set_shape([4])   # 12 bytes for a shape that needs 16
    expect_error(lambda: client.infer("identity_fp32", [t]), 400,
                 "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. "
                 "Expected 16, got 12", exact=True)


def test_bytes_element_count_mismatch(server):
    payload = (3).to_bytes(4, "little") + b"abc"
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(payload)}}]}).encode()
    status, doc = infer_json(server, "string_upper", head + payload,
                             {"Inference-Header-Content-Length": str(len(head))})
    assert (status, doc["error"]) == (400, "[request id: <id_unknown>] expected 2 string elements for inference "
                                           "input 'INPUT0' for model 'string_upper', got 1")


def test_malformed_json(server):
    status, doc = infer_json(server, "identity_fp32", b'{"inputs": [')
    assert status == 400 and doc["error"].startswith("failed to parse the request JSON buffer")
    status, doc = infer_json(server, "identity_fp32", b'[1, 2]')
    assert status == 400 and doc["error"].startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize("depth", [101, 1000, 10_000])
def test_json_nesting_too_deep(server, depth):
    data = "[" * depth + "1" + "]" * depth
    body = ('{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":' + data + "}]}").encode()
    status, doc = infer_json(server, "identity_fp32", body)
    assert (status, doc) == (400, {"error": "JSON nesting depth exceeds maximum allowed limit (100)"})
    # Deep nesting after a shallow first element is found too.
    data = "[1," + "[" * 200 + "1" + "]" * 200 + "]"
    body = ('{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":' + data + "}]}").encode()
    status, doc = infer_json(server, "identity_fp32", body)
    assert (status, doc) == (400, {"error": "JSON nesting depth exceeds maximum allowed limit (100)"})


def binary_request(server, model: str, head: dict, payload: bytes, header_len: str | None = None):
    h = json.dumps(head).encode()
    headers = {"Inference-Header-Content-Length": header_len if header_len is not None else str(len(h))}
    return infer_json(server, model, h + payload, headers)


def test_binary_framing_errors(server):
    head = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}
    assert binary_request(server, "identity_fp32", head, b"\0" * 12) == (
        400, {"error": "unexpected additional input data for model 'identity_fp32'"})
    assert binary_request(server, "identity_fp32", head, b"\0" * 5) == (
        400, {"error": "unexpected size for input 'INPUT0', expecting 3 additional bytes for model 'identity_fp32'"})
    size = len(json.dumps(head)) + 8
    assert binary_request(server, "identity_fp32", head, b"\0" * 8, "abc") == (
        400, {"error": "Unable to parse Inference-Header-Content-Length, got: abc"})
    assert binary_request(server, "identity_fp32", head, b"\0" * 8, "99999") == (
        400, {"error": f"inference header size should be in range (0, {size}), got: 99999"})
    assert binary_request(server, "identity_fp32", head, b"\0" * 8, "-5") == (
        400, {"error": f"inference header size should be in range (0, {size}), got: -5"})
    assert binary_request(server, "identity_fp32", head, b"\0" * 8, "99999999999") == (
        400, {"error": "Unable to parse Inference-Header-Content-Length, value is out of range "
                       "[ -2147483648, 2147483647 ], got: 99999999999"})
    ok = binary_request(server, "identity_fp32", head, np.array([1, 2], np.float32).tobytes())
    assert ok[0] == 200 and ok[1]["outputs"][0]["data"] == [1.0, 2.0]


def test_unsupported_content_encoding(server):
    status, headers, body = request(server, "POST", "/v2/models/identity_fp32/infer", b"{}", {"Content-Encoding": "br"})
    assert (status, json.loads(body)) == (501, {"error": "Unsupported compression type"})
    assert headers["accept-encoding"] == "gzip, deflate"


def test_unknown_path_and_method(server):
    for path in ("/nope", "/v2/models/mlp_onnx/nope", "/v2/models/mlp_onnx/versions/1/trace/setting"):
        status, headers, body = request(server, "GET", path)
        assert (status, json.loads(body)) == (404, {"error": "Not Found"}), path
        assert headers["content-type"] == "application/json"
    status, _, body = request(server, "DELETE", "/v2/health/live")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
    status, _, body = request(server, "GET", "/v2/models/mlp_onnx/infer")
    assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})


# ------------------------------------------------------------------------- repository, statistics, metrics

def test_repository_index(client, server):
    index = client.get_model_repository_index()
    assert isinstance(index, list)
    by_name = {e["name"]: e for e in index}
    for name in ("mlp_onnx", "mlp_onnx_nobatch", "add_sub_onnx", "identity_fp32", "identity_dyn", "string_upper",
                 "dtypes_py", "batch_reporter"):
        e = by_name[name]
        assert (e["version"], e["state"]) == ("1", "READY") and "reason" not in e, e
    assert all(set(e) <= {"name", "version", "state", "reason"} for e in index)
    status, _, body = request(server, "POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and len(json.loads(body)) == len(index)
    status, _, body = request(server, "POST", "/v2/repository/index", b'{"ready": "x"}')
    assert (status, json.loads(body)) == (400, {"error": "Invalid value for 'ready': expected a boolean"})


def test_load_unload_not_allowed(client):
    message = "explicit model load / unload is not allowed if polling is enabled"
    expect_error(lambda: client.load_model("identity_fp32"), 503, message, exact=True)
    expect_error(lambda: client.unload_model("identity_fp32"), 503, message, exact=True)
    assert client.is_model_ready("identity_fp32")


def test_statistics_exact_counts(client, server):
    before = client.get_inference_statistics(STATS_MODEL)["model_stats"]
    assert len(before) == 1
    s = before[0]
    assert (s["name"], s["version"]) == (STATS_MODEL, "1")
    for key in ("last_inference", "inference_count", "execution_count", "inference_stats", "batch_stats"):
        assert key in s
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
                "cache_miss"):
        assert set(s["inference_stats"][key]) == {"count", "ns"}
    assert s["inference_count"] == s["execution_count"] == s["inference_stats"]["success"]["count"] == 0
    x = np.zeros((2, 256), np.float32)
    for _ in range(5):
        client.infer(STATS_MODEL, [fp32_input("INPUT0", x)])
    (s,) = client.get_inference_statistics(STATS_MODEL, "1")["model_stats"]
    assert s["inference_count"] == 10
    assert s["execution_count"] == 5
    assert s["inference_stats"]["success"]["count"] == 5
    assert s["inference_stats"]["queue"]["count"] == 5
    assert s["inference_stats"]["compute_infer"]["count"] == 5
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert s["last_inference"] > 0
    assert [b["batch_size"] for b in s["batch_stats"]] == [2]
    assert s["batch_stats"][0]["compute_infer"]["count"] == 5
    every = client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in every} >= {STATS_MODEL, "mlp_onnx", "identity_fp32"}
    expect_error(lambda: client.get_inference_statistics("nope"), 400, "nope")

    status, text = http_get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    assert status == 200
    lines = text.decode().splitlines()
    assert f'nv_inference_request_success{{model="{STATS_MODEL}",version="1"}} 5' in lines
    assert f'nv_inference_count{{model="{STATS_MODEL}",version="1"}} 10' in lines
    assert f'nv_inference_exec_count{{model="{STATS_MODEL}",version="1"}} 5' in lines
    assert "# TYPE nv_inference_request_success counter" in lines


def test_logging_and_trace_settings(client, server):
    defaults = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
                "log_format": "default"}
    assert client.get_log_settings() == defaults
    assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert client.update_log_settings({"log_verbose_level": 0}) == defaults
    for body, status, message in [
            ({"log_verbose_level": -1}, 400, None),
            ({"log_format": "xml"}, 503, "invalid argument for --log_format, got: xml"),
            ({"log_file": "/tmp/x.log"}, 501, "log file location can not be updated through network protocol")]:
        got, _, data = request(server, "POST", "/v2/logging", json.dumps(body).encode())
        assert got == status, data
        if message:
            assert json.loads(data) == {"error": message}
    trace = client.get_trace_settings()
    assert set(trace) >= {"trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode"}
    assert isinstance(trace["trace_rate"], str) and isinstance(trace["trace_level"], list)
    model = client.update_trace_settings("mlp_onnx", {"trace_rate": "5"})
    assert model["trace_rate"] == "5"
    assert client.update_trace_settings("mlp_onnx", {"trace_rate": None})["trace_rate"] == trace["trace_rate"]


def test_still_serving_after_errors(client, server):
    """Runs last: every malformed request above left the server live and other requests unaffected."""
    assert client.is_server_live() and client.is_server_ready()
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(client.infer("identity_fp32", [fp32_input("INPUT0", x)]).as_numpy("OUTPUT0"), x)
    assert server.proc.poll() is None
