"""ModelInfer's request parsed once, and ModelInfer's and ModelStreamInfer's responses as
protobuf bytes, encoded once.

A large request's raw_input_contents are taken as views of the received bytes: protobuf would
copy each tensor twice (into the message, then into the bytes the field returns) before the
frontend copies it into shared memory. The other fields parse with protobuf.

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
# A request this large carries tensor bytes whose copies cost more than finding them; below it
# protobuf parses the whole request.
VIEW_MIN = 64 * 1024
_RAW_INPUT = 7          # ModelInferRequest.raw_input_contents
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


def parse_request(data: bytes) -> tuple[pb.ModelInferRequest, list[memoryview] | None]:
    """The request and, when it is large, its raw_input_contents as views of `data` (None:
    read them from the message). Bytes that are not a well-formed message go to protobuf
    whole, which refuses them."""
    if len(data) >= VIEW_MIN:
        split = _split_raw_inputs(data)
        if split is not None:
            return pb.ModelInferRequest.FromString(split[0]), split[1]
    return pb.ModelInferRequest.FromString(data), None


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]] | None:
    """(the message without its raw_input_contents, those contents as views), walking the
    top-level fields; None when a field is malformed or of a wire type it does not skip."""
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    kept = 0            # where the bytes not yet put in `rest` begin
    i, n = 0, len(data)
    while i < n:
        key, j = _read_varint(data, i)
        wire = key & 7
        if wire == 2:
            length, j = _read_varint(data, j)
            end = j + length
            if end > n:
                return None
            if key >> 3 == _RAW_INPUT:
                rest.append(view[kept:i])
                raw.append(view[j:end])
                kept = end
        elif wire == 0:
            _, end = _read_varint(data, j)
        elif wire == 1:
            end = j + 8
        elif wire == 5:
            end = j + 4
        else:
            return None
        if end > n or key >> 3 == 0:
            return None
        i = end
    if not raw:
        return None
    rest.append(view[kept:])
    return b"".join(rest), raw


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at `i` and where it ends (an unterminated one ends past the data)."""
    value = shift = 0
    for k in range(i, min(i + 10, len(data))):
        b = data[k]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, k + 1
        shift += 7
    return 0, len(data) + 1
