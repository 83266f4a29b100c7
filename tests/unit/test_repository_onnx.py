import onnx
import pytest
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2

from tritond.repository import devices
from tritond.repository.config import load_model_config, validate_config
from tritond.repository.errors import ConfigError
from tritond.repository.layout import ModelSource

TYPE_FP32 = model_config_pb2.TYPE_FP32
TYPE_INT64 = model_config_pb2.TYPE_INT64


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def onnx_model(root, name, first_dim, config=None, dtype=TensorProto.FLOAT, rest=(16,)):
    """An Identity graph x -> y of shape [first_dim, *rest]."""
    version = root / name / "1"
    version.mkdir(parents=True)
    shape = [first_dim, *rest]
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(version / "model.onnx"))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return ModelSource(name, str(root / name), str(root))


def io(entries):
    return [(e.name, e.data_type, list(e.dims)) for e in entries]


def test_dynamic_batch_dim_autocompletes_batching(tmp_path):
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch"))
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == ("onnxruntime", "onnxruntime_onnx", "model.onnx")
    assert cfg.max_batch_size == 4
    assert cfg.HasField("dynamic_batching")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4]
    assert io(cfg.input) == [("x", TYPE_FP32, [16])]
    assert io(cfg.output) == [("y", TYPE_FP32, [16])]
    assert cfg.instance_group[0].count == 2
    validate_config(cfg, model_path=str(tmp_path / "m"))


def test_default_max_batch_size_is_configurable(tmp_path):
    cfg = load_model_config(onnx_model(tmp_path, "m", -1), default_max_batch_size=1)
    assert cfg.max_batch_size == 1 and not cfg.HasField("dynamic_batching")


def test_fixed_first_dim_means_no_batching(tmp_path):
    cfg = load_model_config(onnx_model(tmp_path, "m", 3))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert io(cfg.input) == [("x", TYPE_FP32, [3, 16])]


def test_per_batch_scalar_gets_dims_1_and_empty_reshape(tmp_path):
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch", rest=()))
    assert cfg.max_batch_size == 4
    assert list(cfg.input[0].dims) == [1]
    assert cfg.input[0].HasField("reshape") and list(cfg.input[0].reshape.shape) == []
    validate_config(cfg)


def test_autocomplete_disabled_leaves_config_alone(tmp_path):
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch", 'backend: "onnxruntime"'), autocomplete=False)
    assert cfg.max_batch_size == 0 and not cfg.input and not cfg.output


def test_full_config_is_not_autocompleted_but_is_checked(tmp_path):
    config = """
backend: "onnxruntime"
max_batch_size: 0
input [{ name: "x" data_type: TYPE_FP32 dims: [-1, 16] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [-1, 16] }]
"""
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch", config))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")


def test_missing_fields_of_listed_entries_are_filled(tmp_path):
    config = 'max_batch_size: 8\ninput [{ name: "x" }]\noutput [{ name: "y" data_type: TYPE_FP32 }]'
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch", config))
    assert io(cfg.input) == [("x", TYPE_FP32, [16])]
    assert io(cfg.output) == [("y", TYPE_FP32, [16])]
    assert cfg.max_batch_size == 8


def test_missing_outputs_are_filled_from_graph(tmp_path):
    config = 'max_batch_size: 2\ninput [{ name: "x" data_type: TYPE_FP32 dims: [16] }]'
    cfg = load_model_config(onnx_model(tmp_path, "m", "batch", config))
    assert io(cfg.output) == [("y", TYPE_FP32, [16])]
    assert cfg.HasField("dynamic_batching")


@pytest.mark.parametrize(
    "config, field, text",
    [
        (
            'input [{ name: "z" data_type: TYPE_FP32 dims: [16] }]',
            "input[0].name",
            "unexpected inference input 'z', allowed inputs are: x",
        ),
        (
            'input [{ name: "x" data_type: TYPE_INT64 dims: [16] }]',
            "input[0].data_type",
            "configuration expects datatype TYPE_INT64 for input 'x', model provides TYPE_FP32",
        ),
        (
            'output [{ name: "y" data_type: TYPE_FP32 dims: [8] }]',
            "output[0].dims",
            "tensor 'y': the model expects 2 dimensions (shape [-1,16]) but the model configuration specifies 2 "
            "dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
            "making complete shape [-1,8])",
        ),
        (
            'max_batch_size: 4\noutput [{ name: "q" data_type: TYPE_FP32 dims: [16] }]',
            "output[0].name",
            "allowed outputs are: y",
        ),
    ],
)
def test_config_that_contradicts_graph_is_an_error(tmp_path, config, field, text):
    src = onnx_model(tmp_path, "m", "batch", config)
    with pytest.raises(ConfigError) as e:
        load_model_config(src)
    assert e.value.field == field
    assert text in e.value.message
    assert e.value.file == f"{src.path}/config.pbtxt"


def test_batching_requested_for_fixed_graph_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not support batching") as e:
        load_model_config(onnx_model(tmp_path, "m", 3, "max_batch_size: 8"))
    assert e.value.field == "max_batch_size"


def test_unconfigured_graph_input_is_an_error(tmp_path):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    a = helper.make_tensor_value_info("a", TensorProto.INT64, [2])
    b = helper.make_tensor_value_info("b", TensorProto.INT64, [2])
    c = helper.make_tensor_value_info("c", TensorProto.INT64, [2])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(version / "model.onnx"))
    (tmp_path / "m" / "config.pbtxt").write_text(
        'input [{ name: "a" data_type: TYPE_INT64 dims: [2] }]\noutput [{ name: "c" data_type: TYPE_INT64 dims: [2] }]'
    )
    with pytest.raises(ConfigError, match="configuration expects 1 inputs, model provides 2; not configured: b"):
        load_model_config(ModelSource("m", str(tmp_path / "m"), str(tmp_path)))


def test_unreadable_onnx_names_the_model_file(tmp_path):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"\xff\x00not a protobuf" * 10)
    with pytest.raises(ConfigError, match="cannot read ONNX model") as e:
        load_model_config(ModelSource("m", str(tmp_path / "m"), str(tmp_path)))
    assert e.value.file == str(version / "model.onnx")


def test_missing_onnx_file_is_reported_by_validation(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "onnxruntime"')
    src = ModelSource("m", str(tmp_path / "m"), str(tmp_path))
    cfg = load_model_config(src)
    with pytest.raises(ConfigError, match="version 1 has no model file 'model.onnx'"):
        validate_config(cfg, model_path=src.path)


def test_sequence_control_and_state_inputs_count_as_configured(tmp_path):
    """A sequence model's graph takes its control inputs and implicit state, which the config
    names under sequence_batching, not `input` (qa's simple_dyna_sequence, L0_http)."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    names = ("a", "START", "CORRID", "STATE_IN")
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, [2]) for n in names]
    c = helper.make_tensor_value_info("c", TensorProto.INT64, [2])
    graph = helper.make_graph([helper.make_node("Sum", list(names), ["c"])], "g", ins, [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(version / "model.onnx"))
    (tmp_path / "m" / "config.pbtxt").write_text(
        'input [{ name: "a" data_type: TYPE_INT64 dims: [2] }]\n'
        'output [{ name: "c" data_type: TYPE_INT64 dims: [2] }]\n'
        'sequence_batching { control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [0, 1] }] }, { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID '
        'data_type: TYPE_UINT64 }] }]\n'
        'state [{ input_name: "STATE_IN" output_name: "c" data_type: TYPE_INT64 dims: [2] }] }'
    )
    cfg = load_model_config(ModelSource("m", str(tmp_path / "m"), str(tmp_path)))
    assert [io.name for io in cfg.input] == ["a"]


def test_graph_disagreements_in_the_onnx_backends_words(tmp_path):
    """As the ONNX Runtime backend reports them (L0_model_config greps for these)."""
    with pytest.raises(ConfigError) as e:
        load_model_config(onnx_model(tmp_path, "fixed", 3, "max_batch_size: 8"))
    assert ("autofill failed for model 'fixed': model does not support batching while non-zero max_batch_size is "
            "specified") in e.value.message
    extra = ('input [{ name: "x" data_type: TYPE_FP32 dims: [16] }, { name: "z" data_type: TYPE_FP32 dims: [16] }]\n'
             'output [{ name: "y" data_type: TYPE_FP32 dims: [16] }]')
    with pytest.raises(ConfigError) as e:
        load_model_config(onnx_model(tmp_path, "extra", "batch", "max_batch_size: 4\n" + extra))
    assert e.value.message == "unable to load model 'extra', configuration expects 2 inputs, model provides 1"
    nobatch = 'input [{ name: "x" data_type: TYPE_FP32 dims: [3, 8] }]\noutput [{ name: "y" data_type: TYPE_FP32 dims: [3, 16] }]'
    with pytest.raises(ConfigError) as e:
        load_model_config(onnx_model(tmp_path, "nobatch", 3, nobatch))
    assert e.value.message == ("model 'nobatch', tensor 'x': the model expects 2 dimensions (shape [3,16]) but the "
                               "model configuration specifies 2 dimensions (shape [3,8])")


def test_overridable_initializer_may_be_listed_as_an_optional_input(tmp_path):
    """As the ONNX Runtime backend: a graph input that has an initializer is an input the config
    may list (L0_initializer_as_input)."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    init = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x, w], [y], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(version / "model.onnx"))
    (tmp_path / "m" / "config.pbtxt").write_text(
        'input [{ name: "x" data_type: TYPE_FP32 dims: [2] }, { name: "w" data_type: TYPE_FP32 dims: [2] '
        'optional: true }]\noutput [{ name: "y" data_type: TYPE_FP32 dims: [2] }]')
    cfg = load_model_config(ModelSource("m", str(tmp_path / "m"), str(tmp_path)))
    assert [i.name for i in cfg.input] == ["x", "w"]
