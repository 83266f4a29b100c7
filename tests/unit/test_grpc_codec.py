"""The ModelInfer response encoded by hand is the message protobuf would have serialized."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tritond.frontend.dataplane import InferResult, OutputTensor
from tritond.frontend.grpc import converters as cv
from tritond.frontend.grpc.codec import VIEW_MIN, ResponseEncoder, parse_request, varint


def result(**kw) -> InferResult:
    outputs = kw.pop("outputs", [OutputTensor("OUTPUT0", "FP32", [1, 16], np.arange(16, dtype=np.float32).tobytes())])
    return InferResult(kw.pop("model_name", "identity_fp32"), kw.pop("model_version", 1), kw.pop("id", ""),
                       outputs, **kw)


CASES = {
    "plain": result(),
    "id": result(id="request-7"),
    "bytes view": result(outputs=[OutputTensor("OUT", "UINT8", [300], memoryview(bytes(range(256)) + bytes(44)))]),
    "shm output": result(outputs=[OutputTensor("A", "INT64", [2], None, "region"),
                                  OutputTensor("B", "BYTES", [1], b"\x03\x00\x00\x00abc")]),
    "empty data": result(outputs=[OutputTensor("E", "FP32", [0], b"")]),
    "scalar": result(outputs=[OutputTensor("S", "FP32", [], b"\0\0\x80?")]),
    "large dims": result(model_version=123456, outputs=[OutputTensor("L", "INT8", [1 << 40, 200, 127, 128], b"")]),
    "no outputs": result(outputs=[]),
    "unicode": result(model_name="modèle", id="ид", outputs=[OutputTensor("sortie_é", "FP32", [1], b"\0\0\0\0")]),
    "parameters": result(parameters={"sequence_id": 5, "flag": True, "x": 0.5, "s": "v"}),
}


@pytest.mark.parametrize("name", CASES)
def test_encoded_response_is_protobufs(name):
    r = CASES[name]
    expected = cv.infer_response(r)
    encoded = ResponseEncoder().infer_response(r)
    assert pb.ModelInferResponse.FromString(encoded) == expected
    if not r.parameters:
        assert encoded == expected.SerializeToString()


def test_cached_heads_and_outputs_follow_each_response():
    enc = ResponseEncoder()
    for version, shape in ((1, [2]), (2, [3]), (1, [2])):
        r = result(model_version=version, outputs=[OutputTensor("O", "FP32", shape, bytes(4 * shape[0]))])
        assert pb.ModelInferResponse.FromString(enc.infer_response(r)) == cv.infer_response(r)


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 1 << 35, -1, -(1 << 40)])
def test_varint_matches_protobuf_int64(n):
    t = pb.ModelInferResponse.InferOutputTensor(shape=[n])
    assert t.SerializeToString() == b"\x1a" + bytes([len(varint(n))]) + varint(n)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("final", [False, True])
def test_encoded_stream_response_is_protobufs(name, final):
    r = CASES[name]
    expected = cv.stream_response(r, final)
    encoded = ResponseEncoder().stream_response(r, final)
    assert pb.ModelStreamInferResponse.FromString(encoded) == expected
    if not r.parameters:
        assert encoded == expected.SerializeToString()


# ---------------------------------------------------------------- requests

def infer_request(*raws: bytes, **fields) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="identity_fp32", id="r1", **fields)
    for i, raw in enumerate(raws):
        t = req.inputs.add(name=f"INPUT{i}", datatype="UINT8")
        t.shape.append(len(raw))
        t.parameters["p"].int64_param = i
    req.outputs.add(name="OUTPUT0")
    req.raw_input_contents.extend(raws)
    req.parameters["priority"].uint64_param = 3
    return req


def test_a_large_requests_raw_inputs_are_views_of_the_received_bytes():
    raws = (bytes(range(256)) * 400, b"\x07" * 70_000, b"")
    data = infer_request(*raws).SerializeToString()
    request, raw = parse_request(data)
    assert [bytes(r) for r in raw] == list(raws)
    assert all(isinstance(r, memoryview) and r.obj is data for r in raw)
    expected = infer_request(*raws)
    del expected.raw_input_contents[:]
    assert request == expected and not request.raw_input_contents
    assert [bytes(t.data) for t in cv.parse_inputs(request, raw)] == list(raws)


def test_raw_inputs_between_other_fields_and_unknown_fields_keep_their_meaning():
    big = b"\x01" * 100_000
    req = infer_request(b"ab")
    # field order as a client may write it: a raw input first, unknown fields (numbers 90 and 91,
    # varint and 32-bit) between the known ones
    data = (b"\x3a" + varint(len(big)) + big + b"\xd0\x05\x2a" + req.SerializeToString()
            + b"\xdd\x05\x01\x02\x03\x04")
    request, raw = parse_request(data)
    reference = pb.ModelInferRequest.FromString(data)
    assert [bytes(r) for r in raw] == list(reference.raw_input_contents) == [big, b"ab"]
    del reference.raw_input_contents[:]
    assert request == reference


def test_a_small_request_is_parsed_by_protobuf_alone():
    data = infer_request(b"\x00" * 64).SerializeToString()
    assert len(data) < VIEW_MIN
    request, raw = parse_request(data)
    assert raw is None and list(request.raw_input_contents) == [b"\x00" * 64]


@pytest.mark.parametrize("tail", [b"\x3a\xff\xff\xff\x7f", b"\x3a\x80", b"\x0b", b"\x00\x01", b"\x3d\x01"])
def test_malformed_large_requests_are_refused_as_protobuf_refuses_them(tail):
    data = infer_request(b"\x05" * 70_000).SerializeToString() + tail
    with pytest.raises(Exception) as parsed:
        pb.ModelInferRequest.FromString(data)
    with pytest.raises(type(parsed.value)):
        parse_request(data)
