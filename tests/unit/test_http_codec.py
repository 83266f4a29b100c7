"""The pure parts of the HTTP codec: request parsing and response rendering, no server."""
from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from tritond.frontend.dataplane import InferResult, OutputTensor
from tritond.frontend.errors import http_status
from tritond.frontend.http.infer import choose_encoding, parse_header_length
from tritond.frontend.http.codec import MAX_JSON_DEPTH, parse_json, response_parts
from tritond.frontend.http.codec import parse_infer as parse_with_view
from tritond.repository.datatypes import serialize_bytes
from tritond.repository.view import model_view
from tritond.wire.errors import TritonError


def render_response(result: InferResult, default_binary: bool) -> tuple[bytes, int | None]:
    """The whole body and the JSON part's length (None: JSON only), as the client reads it."""
    head, blobs = response_parts(result, default_binary)
    return (b"".join([head, *blobs]), len(head)) if blobs else (head, None)


def parse_infer(body, header_len, model, config, limit):
    return parse_with_view(body, header_len, model, model_view(config), limit)


IDENTITY = {"max_batch_size": 0, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
BATCHED = {"max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
LIMIT = 1 << 20


def parse(doc: dict, binary: bytes = b"", config: dict = IDENTITY, limit: int = LIMIT):
    head = json.dumps(doc).encode()
    return parse_infer(head + binary, len(head) if binary else None, "m", config, limit)


def error_of(fn) -> str:
    with pytest.raises(TritonError) as info:
        fn()
    assert http_status(info.value) == 400
    return info.value.message


def test_json_inputs_nested_and_flat():
    doc = {"inputs": [{"name": "INPUT0", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}],
           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True, "classification": 2}}]}
    _, inputs, outputs, default_binary = parse(doc)
    assert np.frombuffer(inputs[0].data, np.float32).tolist() == [1, 2, 3, 4]
    assert (outputs[0].name, outputs[0].binary, outputs[0].classification) == ("OUTPUT0", True, 2)
    assert default_binary is False


def test_json_datatypes():
    doc = {"inputs": [
        {"name": "B", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "I", "shape": [2], "datatype": "INT64", "data": [-(1 << 62), 7]},
        {"name": "S", "shape": [2], "datatype": "BYTES", "data": ["h\u00e9", ""]},
    ]}
    _, (b, i, s), _, _ = parse(doc)
    assert bytes(b.data) == b"\x01\x00"
    assert np.frombuffer(i.data, np.int64).tolist() == [-(1 << 62), 7]
    assert bytes(s.data) == (3).to_bytes(4, "little") + "h\u00e9".encode() + (0).to_bytes(4, "little")


@pytest.mark.parametrize("datatype, data", [("INT32", [1.5]), ("BOOL", [1]), ("FP32", ["1"]), ("UINT8", [-1]),
                                            ("INT8", [300])])
def test_json_wrong_value_types(datatype, data):
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": datatype, "data": data}]}
    assert error_of(lambda: parse(doc)).startswith("Unable to parse 'data'")


def test_binary_inputs_and_framing():
    doc = {"inputs": [{"name": "A", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
                      {"name": "B", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 8}}],
           "parameters": {"binary_data_output": True}}
    payload = np.array([1, 2], np.float32).tobytes() + np.array([9], np.int64).tobytes()
    _, (a, b), outputs, default_binary = parse(doc, payload)
    assert np.frombuffer(a.data, np.float32).tolist() == [1, 2]
    assert np.frombuffer(b.data, np.int64).tolist() == [9]
    assert outputs == [] and default_binary is True
    assert error_of(lambda: parse(doc, payload + b"x")) == "unexpected additional input data for model 'm'"
    assert error_of(lambda: parse(doc, payload[:-3])) == \
        "unexpected size for input 'B', expecting 3 additional bytes for model 'm'"


def test_raw_request_shapes():
    _, (t,), outputs, default_binary = parse_infer(b"\0" * 12, 0, "m", IDENTITY, LIMIT)
    assert (t.name, t.datatype, t.shape, default_binary) == ("INPUT0", "FP32", [3], True)
    _, (t,), _, _ = parse_infer(b"\0" * 16, 0, "m", BATCHED, LIMIT)
    assert t.shape == [1, 4]
    strings = {"max_batch_size": 0, "input": [{"name": "S", "data_type": "TYPE_STRING", "dims": [1]}]}
    _, (t,), _, _ = parse_infer(b"hello", 0, "m", strings, LIMIT)
    assert (t.shape, bytes(t.data)) == ([1], (5).to_bytes(4, "little") + b"hello")


def test_raw_request_errors():
    two = {"max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [-1]},
                                          {"name": "B", "data_type": "TYPE_FP32", "dims": [-1]}]}
    assert error_of(lambda: parse_infer(b"\0" * 4, 0, "m", two, LIMIT)) == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs "
        "in 'm' model configuration")
    dyn = {"max_batch_size": 0, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [-1, -1]}]}
    assert error_of(lambda: parse_infer(b"\0" * 4, 0, "m", dyn, LIMIT)) == (
        "[request id: <id_unknown>] The shape of the raw input 'A' can not be deduced because there are more than "
        "one variable-sized dimension")
    strings = {"max_batch_size": 0, "input": [{"name": "S", "data_type": "TYPE_STRING", "dims": [2]}]}
    assert error_of(lambda: parse_infer(b"ab", 0, "m", strings, LIMIT)) == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'S', the model must have input shape [1]")


def test_nesting_depth_limit():
    ok = [1]
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = [ok]
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": ok}]}
    assert np.frombuffer(parse(doc)[1][0].data, np.float32).tolist() == [1.0]
    doc["inputs"][0]["data"] = [ok]
    assert error_of(lambda: parse(doc)) == "JSON nesting depth exceeds maximum allowed limit (100)"
    deep = b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}]}"
    assert error_of(lambda: parse_infer(deep, None, "m", IDENTITY, LIMIT)) == \
        "JSON nesting depth exceeds maximum allowed limit (100)"


def test_json_input_size_limit():
    doc = {"inputs": [{"name": "X", "shape": [300], "datatype": "FP32", "data": [0] * 300}]}
    assert error_of(lambda: parse(doc, limit=1000)) == (
        "JSON input 'X' has a byte_size (1200 bytes) that exceeds the maximum allowed value of 1000 bytes. "
        "Use --http-max-input-size to increase the limit.")


@pytest.mark.parametrize("params, message", [
    ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                      "specified."),
    ({"priority": -1}, "Unable to parse 'priority'"),
    ({"sequence_start": 1}, "Unable to parse 'sequence_start'"),
    ({"binary_data_output": "yes"}, "Unable to parse 'binary_data_output'"),
    ({"custom": [1]}, "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"custom": None}, "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
])
def test_request_parameter_errors(params, message):
    doc = {"parameters": params, "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}
    assert error_of(lambda: parse(doc)) == message


@pytest.mark.parametrize("output, message", [
    ({"name": "O", "parameters": {"shared_memory_region": "r", "classification": 1}},
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({"name": "O", "parameters": {"shared_memory_region": "r", "binary_data": True}},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ({"name": "O", "parameters": 5}, "Unable to parse 'parameters'"),
    ({"name": "O", "parameters": {"classification": "3"}}, "Unable to set 'classification'"),
    ({"parameters": {}}, "Unable to parse 'name'"),
    ("O", "Unable to parse 'outputs'"),
])
def test_output_errors(output, message):
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": [output]}
    assert error_of(lambda: parse(doc)) == message


def test_parse_json_errors():
    assert error_of(lambda: parse_json(b"{")).startswith("failed to parse the request JSON buffer")
    assert error_of(lambda: parse_json(b"[]")).startswith("failed to parse the request JSON buffer")


def test_header_length_like_stoi():
    assert parse_header_length("12") == 12
    assert parse_header_length(" 12abc") == 12
    assert parse_header_length("-3") == -3
    assert error_of(lambda: parse_header_length("abc")) == "Unable to parse Inference-Header-Content-Length, got: abc"
    assert error_of(lambda: parse_header_length("4294967296")) == (
        "Unable to parse Inference-Header-Content-Length, value is out of range [ -2147483648, 2147483647 ], "
        "got: 4294967296")


@pytest.mark.parametrize("accept, chosen", [
    ("", "identity"), ("gzip", "gzip"), ("deflate, gzip;q=0.5", "deflate"), ("br, gzip;q=0.2", "gzip"),
    ("gzip;q=0, identity", "identity"), ("gzip;q=x, deflate;q=0.1", "deflate"),
])
def test_choose_encoding(accept, chosen):
    assert choose_encoding(accept) == chosen


def test_render_json_and_binary():
    f = np.array([1.5, 2], np.float32)
    s = np.array([b"ab", b""], dtype=np.object_)
    result = InferResult("m", 3, "rid", [
        OutputTensor("F", "FP32", [2], f.tobytes()),
        OutputTensor("S", "BYTES", [2], serialize_bytes(s), binary=True),
        OutputTensor("H", "FP16", [1], np.array([0.5], np.float16).tobytes()),
    ])
    body, json_len = render_response(result, default_binary=False)
    head = orjson.loads(body[:json_len])
    assert head["id"] == "rid" and head["model_version"] == "3"
    assert head["outputs"][0]["data"] == [1.5, 2.0]
    assert head["outputs"][1]["parameters"] == {"binary_data_size": len(serialize_bytes(s))}
    assert head["outputs"][2]["data"] == [0.5]
    assert body[json_len:] == serialize_bytes(s)
    body, json_len = render_response(InferResult("m", 1, "", [OutputTensor("F", "FP32", [2], f.tobytes())]), False)
    assert json_len is None and "id" not in orjson.loads(body)


def test_listed_outputs_are_json_unless_binary_requested():
    doc = {"parameters": {"binary_data_output": True},
           "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}],
           "outputs": [{"name": "A"}, {"name": "B", "parameters": {"binary_data": True}}]}
    _, _, (a, b), default_binary = parse(doc)
    assert (a.binary, b.binary, default_binary) == (False, True, True)


def test_bf16_output_needs_binary():
    t = OutputTensor("B", "BF16", [1], b"\x80\x3f")
    assert error_of(lambda: render_response(InferResult("m", 1, "", [t]), False)) == \
        "sending BF16 data via JSON is not supported. Please use the binary data format for output"
    body, json_len = render_response(InferResult("m", 1, "", [t]), True)
    assert body[json_len:] == b"\x80\x3f"


def test_shape_overflow_errors_are_tritons():
    """Triton's JSON-input checks: an element count past INT64_MAX, then a byte size past it, each
    named; a negative or non-integer dimension is its (HTTP 500) parse error."""
    def shape_error(shape):
        with pytest.raises(TritonError) as info:
            parse({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]})
        return http_status(info.value), info.value.message
    assert shape_error([2**4, 2**60 + 2]) == (
        400, "invalid shape for input 'INPUT0': shape [16,1152921504606846978] causes total element count to "
             "exceed maximum size of 9223372036854775807")
    assert shape_error([2**2, 2**60 + 2]) == (
        400, "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data type size (4) "
             "exceeds maximum allowed size (9223372036854775807)")
    assert shape_error([2, -5]) == (
        500, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer")
