"""ModelInfer's and ModelStreamInfer's responses as protobuf bytes, encoded once.

The response is written field by field in field-number order, as protobuf serializes it:
the model's name and version (encoded once per model version), the id, each output's
name, datatype and shape (encoded once per distinct output), then every output's bytes,
copied once from the worker's shared memory into the message (a stream response wraps
the same fields, with `triton_final_response` among the parameters). A response that carries
response parameters takes the protobuf message path (converters.py); no model path fills them.
"""
from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from ..dataplane import InferResult
from . import converters as cv

MAX_CACHED = 4096       # encoded heads and output descriptions remembered
_U64 = (1 << 64) - 1
_SMALL = [bytes((n,)) for n in range(0x80)]

# ModelInferResponse fields: 1 model_name, 2 model_version, 3 id, 5 outputs, 6 raw_output_contents;
# InferOutputTensor fields: 1 name, 2 datatype, 3 shape (packed int64).
_NAME, _VERSION, _ID, _OUTPUT, _RAW = b"\x0a", b"\x12", b"\x1a", b"\x2a", b"\x32"
_T_NAME, _T_DATATYPE, _T_SHAPE = b"\x0a", b"\x12", b"\x1a"
# ModelStreamInferResponse field 2 (infer_response); parameters (field 4) entry
# {key: triton_final_response, value: InferParameter{bool_param}}
_STREAM_RESPONSE = b"\x12"
_FINAL = {flag: b"\x22\x1b\x0a\x15" + cv.FINAL_PARAMETER.encode() + b"\x12\x02\x08" + bytes((flag,))
          for flag in (False, True)}


def varint(n: int) -> bytes:
    """A protobuf varint; negative values as their 64-bit two's complement (int64 fields)."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


class ResponseEncoder:
    def __init__(self) -> None:
        self._heads: dict[tuple[str, int], bytes] = {}
        self._outputs: dict[tuple[str, str, tuple[int, ...]], bytes] = {}

    def _head(self, model: str, version: int) -> bytes:
        key = (model, version)
        head = self._heads.get(key)
        if head is None:
            head = _field(_NAME, model.encode()) + _field(_VERSION, str(version).encode())
            if len(self._heads) >= MAX_CACHED:
                self._heads.clear()
            self._heads[key] = head
        return head

    def _output(self, name: str, datatype: str, shape: list[int]) -> bytes:
        key = (name, datatype, tuple(shape))
        encoded = self._outputs.get(key)
        if encoded is None:
            inner = _field(_T_NAME, name.encode()) if name else b""
            if datatype:
                inner += _field(_T_DATATYPE, datatype.encode())
            if shape:
                inner += _field(_T_SHAPE, b"".join([varint(d) for d in shape]))
            encoded = _field(_OUTPUT, inner)
            if len(self._outputs) >= MAX_CACHED:
                self._outputs.clear()
            self._outputs[key] = encoded
        return encoded

    def infer_response(self, result: InferResult) -> bytes:
        """The serialized ModelInferResponse of `result` (outputs written to shared memory
        have an empty `raw_output_contents` entry, as in converters.infer_response)."""
        if result.parameters:
            return cv.infer_response(result).SerializeToString()
        return b"".join(self._parts(result, None))

    def stream_response(self, result: InferResult, final: bool) -> bytes:
        """The serialized ModelStreamInferResponse of converters.stream_response."""
        if result.parameters:
            return cv.stream_response(result, final).SerializeToString()
        parts = self._parts(result, _FINAL[final])
        size = sum([len(p) for p in parts])
        return b"".join([_STREAM_RESPONSE, varint(size), *parts])

    def _parts(self, result: InferResult, parameters: bytes | None) -> list:
        parts = [self._head(result.model_name, result.model_version)]
        if result.id:
            parts.append(_field(_ID, result.id.encode()))
        if parameters is not None:
            parts.append(parameters)
        outputs = result.outputs
        output = self._output
        for t in outputs:
            parts.append(output(t.name, t.datatype, t.shape))
        for t in outputs:
            data = t.data
            if data is None:
                parts.append(b"\x32\x00")
            else:
                parts.append(_RAW + varint(len(data)))
                parts.append(data)
        return parts


def parse_request(data: bytes) -> pb.ModelInferRequest:
    return pb.ModelInferRequest.FromString(data)
