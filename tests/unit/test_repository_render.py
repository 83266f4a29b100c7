import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.repository import devices
from tritond.repository.normalize import normalize_config
from tritond.repository.render import config_from_json, config_to_json, load_config_json, platform_name, tensor_metadata


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def parse(text):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


CONFIG = """
name: "m"
backend: "python"
input [{ name: "x" data_type: TYPE_FP32 dims: [16] reshape { shape: [4, 4] } }]
output [{ name: "y" data_type: TYPE_STRING dims: [-1] }]
version_policy { specific { versions: [1, 3] } }
dynamic_batching {
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 7 } }
}
"""


def test_json_has_numbers_names_and_defaults():
    cfg = parse(CONFIG)
    normalize_config(cfg)
    out = config_to_json(cfg)
    assert out["max_batch_size"] == 0
    assert out["input"][0]["dims"] == [16]
    assert out["input"][0]["reshape"] == {"shape": [4, 4]}
    assert out["input"][0]["data_type"] == "TYPE_FP32"
    assert out["input"][0]["optional"] is False
    assert out["output"][0]["data_type"] == "TYPE_STRING"
    assert out["output"][0]["dims"] == [-1]
    assert out["version_policy"] == {"specific": {"versions": [1, 3]}}
    db = out["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 500
    assert db["priority_levels"] == 2 and db["default_priority_level"] == 1
    assert db["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7
    assert db["priority_queue_policy"]["2"]["timeout_action"] == "REJECT"



def test_int64_fixed_in_every_scheduler():
    ens = config_to_json(
        parse('platform: "ensemble" ensemble_scheduling { step [{ model_name: "a" model_version: -1 }] }')
    )
    assert ens["ensemble_scheduling"]["step"][0]["model_version"] == -1
    seq = config_to_json(
        parse(
            "sequence_batching { max_sequence_idle_microseconds: 5 state [{ dims: [2, 3] }] "
            "oldest { max_queue_delay_microseconds: 9 } }"
        )
    )
    assert seq["sequence_batching"]["max_sequence_idle_microseconds"] == 5
    assert seq["sequence_batching"]["state"][0]["dims"] == [2, 3]
    assert seq["sequence_batching"]["oldest"]["max_queue_delay_microseconds"] == 9


def test_instance_group_kind_rendered_by_name():
    cfg = parse('name: "m" backend: "onnxruntime" platform: "onnxruntime_onnx"')
    normalize_config(cfg)
    out = config_to_json(cfg)
    assert out["instance_group"] == [
        {
            "name": "m",
            "kind": "KIND_CPU",
            "count": 2,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert list(out)[:4] == ["name", "platform", "backend", "runtime"]


def test_no_int64_left_as_string():
    cfg = parse(CONFIG)
    normalize_config(cfg)
    text = json.dumps(config_to_json(cfg))
    for value in ("500", "16", "7", "1000000"):
        assert f'"{value}"' not in text


def test_empty_config_renders_empty():
    assert config_to_json(model_config_pb2.ModelConfig()) == {}


def test_json_round_trip_and_string_ints():
    cfg = parse(CONFIG)
    normalize_config(cfg)
    assert config_from_json(config_to_json(cfg)) == cfg
    parsed = config_from_json(
        {"name": "m", "max_batch_size": 2, "input": [{"name": "x", "data_type": "type_fp32", "dims": ["3", 4]}]}
    )
    assert list(parsed.input[0].dims) == [3, 4]
    assert parsed.input[0].data_type == model_config_pb2.TYPE_FP32


def test_json_parse_errors_are_value_errors():
    with pytest.raises(ValueError, match="no_such_field"):
        config_from_json({"no_such_field": 1})


def test_tensor_metadata_uses_wire_types_and_batch_dim():
    cfg = parse(CONFIG)
    inputs, outputs = tensor_metadata(cfg)
    assert inputs == [{"name": "x", "datatype": "FP32", "shape": [16]}]
    assert outputs == [{"name": "y", "datatype": "BYTES", "shape": [-1]}]
    cfg.max_batch_size = 8
    inputs, _ = tensor_metadata(cfg)
    assert inputs[0]["shape"] == [-1, 16]


@pytest.mark.parametrize(
    "text, name",
    [
        ('backend: "onnxruntime"', "onnxruntime_onnx"),
        ('backend: "python"', "python"),
        ('backend: "pytorch"', "pytorch_libtorch"),
        ('backend: "tensorrt"', "tensorrt_plan"),
        ('platform: "ensemble"', "ensemble"),
        ('backend: "custom"', "custom"),
        ('platform: "tensorflow_savedmodel"', "tensorflow_savedmodel"),
    ],
)
def test_platform_name(text, name):
    assert platform_name(parse(text)) == name


def test_a_load_config_takes_unquoted_identifier_keys_as_tritons_protobuf_parser_does():
    """qa/L0_iterative_sequence loads `..., direct: { ... }` as a config override."""
    text = '{"name": "m", direct: {"max_queue_delay_microseconds": 5}, b_2 :[1], "s": "k: v, {z: 1}"}'
    assert load_config_json(text) == {"name": "m", "direct": {"max_queue_delay_microseconds": 5}, "b_2": [1],
                                      "s": "k: v, {z: 1}"}
    with pytest.raises(ValueError, match="Expecting property name enclosed in double quotes"):
        load_config_json('{"a": 1,')
