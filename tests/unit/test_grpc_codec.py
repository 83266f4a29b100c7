"""The ModelInfer response encoded by hand is the message protobuf would have serialized."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tritond.frontend.dataplane import InferResult, OutputTensor
from tritond.frontend.grpc import converters as cv
from tritond.frontend.grpc.codec import ResponseEncoder, varint


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
