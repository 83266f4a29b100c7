"""A request is refused on what it declares before its values become Python objects: a JSON
tensor larger than the limit, or holding more values than its shape; gRPC typed contents are
converted without a list of Python objects. Measured with tracemalloc (allocations made while
parsing; the request body itself exists before)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from tritond.frontend.grpc.converters import parse_inputs
from tritond.frontend.http.codec import parse_infer
from tritond.repository.view import model_view
from tritond.wire.errors import TritonError

VIEW = model_view({"max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}]})
N = 1 << 21            # values in the body: 8 MiB of text, ~64 MiB as Python floats in a list


def body(shape: list[int]) -> bytes:
    values = b",".join([b"1.5"] * N)
    return b'{"inputs":[{"name":"X","datatype":"FP32","shape":%s,"data":[%s]}]}' % (str(shape).encode(), values)


def peak_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def refused(request: bytes, limit: int) -> str:
    try:
        parse_infer(request, None, "m", VIEW, limit)
    except TritonError as e:
        return e.message
    raise AssertionError("accepted")


@pytest.mark.parametrize("shape, limit, message", [
    ([1 << 40], 1 << 26, "exceeds the maximum allowed value"),            # declared size over the limit
    ([3], 1 << 26, "Shape does not match true shape of 'data' field"),     # more values than the shape
])
def test_a_json_tensor_is_refused_before_its_values_are_parsed(shape, limit, message):
    request = body(shape)
    messages = []
    peak = peak_while(lambda: messages.append(refused(request, limit)))
    assert message in messages[0]
    assert peak < len(request) // 4, f"{peak >> 20} MiB allocated to refuse a {len(request) >> 20} MiB body"


def test_grpc_typed_contents_convert_without_python_objects():
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[N])
    tensor.contents.fp32_contents.extend(np.ones(N, np.float32))
    inputs = []
    peak = peak_while(lambda: inputs.extend(parse_inputs(request)))
    assert len(inputs[0].data) == 4 * N
    assert peak < 3 * 4 * N, f"{peak >> 20} MiB allocated for a {4 * N >> 20} MiB tensor"


def test_a_large_output_renders_as_json_without_python_objects():
    """A small binary request may ask for a large output as JSON: rendering it must not cost
    a Python object per value (it took ~285 bytes per value; the JSON text itself is ~20)."""
    from tritond.frontend.dataplane import InferResult, OutputTensor
    from tritond.frontend.http.codec import response_parts

    values = np.random.default_rng(0).random(N).astype(np.float32)
    result = InferResult("m", 1, "", [OutputTensor("Y", "FP32", [N], values.tobytes(), "", False)])
    rendered = []
    peak = peak_while(lambda: rendered.append(response_parts(result, False)))
    body, _ = rendered[0]
    assert np.array_equal(np.array(orjson.loads(body)["outputs"][0]["data"], np.float32), values)
    assert peak < 100 * N, f"{peak / N:.0f} bytes per value"
