import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.repository.advice import config_advice


def advice(text):
    return config_advice(text_format.Parse(text, model_config_pb2.ModelConfig()))


def test_variable_first_dim_without_batching_is_flagged():
    [msg] = advice('name: "m" input [{ name: "x" data_type: TYPE_FP32 dims: [-1, 16] }]')
    assert msg == (
        "model 'm': input 'x' has a variable first dimension but max_batch_size is 0; "
        "set max_batch_size > 0 and add `dynamic_batching { }` to let the server batch requests"
    )


def test_several_variable_inputs_are_named_together():
    [msg] = advice(
        'name: "m" input [{ name: "a" dims: [-1] }, { name: "b" dims: [3] }, { name: "c" dims: [-1, 2] }]'
    )
    assert "inputs 'a', 'c' have a variable first dimension" in msg


def test_batching_model_without_dynamic_batching_is_flagged():
    [msg] = advice('name: "m" max_batch_size: 8 input [{ name: "x" dims: [16] }]')
    assert "max_batch_size is 8 but there is no dynamic_batching" in msg
    assert "`dynamic_batching { }`" in msg


@pytest.mark.parametrize(
    "text",
    [
        'name: "m" input [{ name: "x" dims: [3, -1] }]',
        'name: "m" max_batch_size: 8 dynamic_batching {} input [{ name: "x" dims: [-1] }]',
        'name: "m" max_batch_size: 1 input [{ name: "x" dims: [-1] }]',
        'name: "m" sequence_batching {} input [{ name: "x" dims: [-1] }]',
        'name: "m" platform: "ensemble" input [{ name: "x" dims: [-1] }]',
    ],
)
def test_no_advice(text):
    assert advice(text) == []


@pytest.mark.parametrize("value", ["off", "OFF"])
def test_a_deliberately_unbatched_model_silences_the_advice(value):
    param = f'parameters {{ key: "batching_advice" value: {{ string_value: "{value}" }} }}'
    assert advice(f'name: "m" input [{{ name: "x" dims: [-1] }}] {param}') == []
    assert advice(f'name: "m" max_batch_size: 8 input [{{ name: "x" dims: [16] }}] {param}') == []


def test_a_misspelt_silencing_value_is_named_and_the_advice_stays():
    param = 'parameters { key: "batching_advice" value: { string_value: "of" } }'
    first, second = advice(f'name: "m" max_batch_size: 8 input [{{ name: "x" dims: [16] }}] {param}')
    assert "parameter 'batching_advice' must be 'on' or 'off', got 'of'" in first
    assert "max_batch_size is 8 but there is no dynamic_batching" in second
