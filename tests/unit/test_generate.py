"""The generate extension's mapping of a JSON body to inputs and parameters, and of a response
to JSON, with Triton's shape rule and error texts."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.frontend.dataplane import InferResult, OutputTensor
from tritond.frontend.http.generate import _shape, parse_generate, render_generate
from tritond.repository.datatypes import serialize_bytes
from tritond.wire import schema as S
from tritond.wire.errors import TritonError


def entry(max_batch_size: int = 0, **inputs: tuple[str, list[int]]) -> S.ModelEntry:
    view = S.ModelView(max_batch_size=max_batch_size,
                       inputs={n: S.TensorView(n, dt, dims) for n, (dt, dims) in inputs.items()})
    return S.ModelEntry("m", 1, S.ModelState.READY, view=view)


@pytest.mark.parametrize("dims,count,shape", [
    ([-1], 3, [3]), ([1], 1, [1]), ([-1, 2], 6, [3, 2]), ([-1, -1], 4, [1, 4]), ([2, -1], 6, [2, 3]),
])
def test_fixed_dimensions_divide_and_the_innermost_variable_one_takes_the_rest(dims, count, shape):
    assert _shape("x", dims, count) == shape


def test_a_count_that_does_not_fit_the_shape_is_refused():
    with pytest.raises(TritonError, match="The schema can not convert input 'x' to tensor with proper shape"):
        _shape("x", [2], 3)


def test_inputs_by_name_and_everything_else_as_parameters():
    e = entry(1, text_input=("BYTES", [1]), max_tokens=("INT32", [1]))
    inputs, opts = parse_generate(b'{"id": "r1", "text_input": "hi", "max_tokens": 4, "temperature": 0.5, '
                                  b'"parameters": {"stream": true}}', e, 1 << 20)
    by_name = {t.name: t for t in inputs}
    assert opts.id == "r1" and opts.params == {"id": "r1", "temperature": 0.5, "stream": True}
    assert by_name["text_input"].shape == [1, 1] and bytes(by_name["text_input"].data) == serialize_bytes(
        np.array([b"hi"], dtype=object))
    assert by_name["max_tokens"].shape == [1, 1]


@pytest.mark.parametrize("body,message", [
    (b'{"id": 5}', "Unable to parse 'id'"),
    (b'{"parameters": 3}', "Expected JSON object for keyword: 'parameters'"),
    (b'{"x": "text"}', "Unable to parse 'data': attempt to access JSON non-double as double"),
    (b'{"x": 1, "n": 1.5}', "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    (b'{"x": 1, "b": "false"}', "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    (b'{"s": 123, "b": 1}', "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    (b'{"b": 1, "s": 123}', "attempt to access JSON non-boolean as boolean"),
    (b'{"s": {"USER": "hi"}}', "attempt to access JSON non-string as string"),
    (b'{"parameters": {"nested": {"twice": 1}}}',
     "^Converting keyword: 'parameters': parameter 'nested' has invalid type"),
    (b'{"x": 1, "s": "a", "x": 2}', "input 'x' already exists in request"),
    (b'{"x": 1, "s": "a", "s": "b", "x": 2}', "input 's' already exists in request"),
    (b'{"x": 1, "parameters": {"x": 2}}', "input 'x' already exists in request"),
    (b'{"flag": [1]}', "parameter 'flag' has invalid type"),
    (b'[1]', "the request must be a JSON object"),
])
def test_errors(body, message):
    with pytest.raises(TritonError, match=message):
        parse_generate(body, entry(0, x=("FP32", [-1]), n=("INT32", [1]), b=("BOOL", [1]), s=("BYTES", [1])),
                       1 << 20)


def test_the_input_size_limit():
    with pytest.raises(TritonError, match="exceeds the maximum allowed input size of 8"):
        parse_generate(b'{"x": [1, 2, 3]}', entry(0, x=("FP32", [-1])), 8)


def test_a_response_is_flat_with_sorted_keys_and_scalars_for_one_element():
    outputs = [OutputTensor("text_output", "BYTES", [1], serialize_bytes(np.array([b"tok"], dtype=object))),
               OutputTensor("LOGITS", "FP32", [2], np.array([0.5, 1.5], np.float32).tobytes())]
    doc = render_generate(InferResult("m", 3, "", outputs))
    assert list(doc) == ["LOGITS", "model_name", "model_version", "text_output"]
    assert doc == {"LOGITS": [0.5, 1.5], "model_name": "m", "model_version": "3", "text_output": "tok"}
