"""Ensemble checks that need no server: Triton's shape-consistency rule between the tensors
steps exchange (with and without the batch dimension), and reading what an ensemble composes
straight from its config file."""
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.repository.spec import ModelSpec
from tritond.repository.ensemble import ensemble_dependencies, validate_ensemble


def parse(text):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def model(name, mbs, in_dims, out_dims):
    cfg = parse(f'name: "{name}" backend: "onnxruntime" max_batch_size: {mbs} '
                f'input [{{ name: "X" data_type: TYPE_FP32 dims: {in_dims} }}] '
                f'output [{{ name: "Y" data_type: TYPE_FP32 dims: {out_dims} }}]')
    return ModelSpec(name, f"/r/{name}", cfg, [1])


def chain(mbs, in_dims, out_dims, specs):
    cfg = parse(f'name: "e" platform: "ensemble" max_batch_size: {mbs} '
                f'input [{{ name: "IN" data_type: TYPE_FP32 dims: {in_dims} }}] '
                f'output [{{ name: "OUT" data_type: TYPE_FP32 dims: {out_dims} }}] '
                'ensemble_scheduling { step [ '
                '{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } }, '
                '{ model_name: "b" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } } ] }')
    return validate_ensemble(cfg, specs)


@pytest.mark.parametrize("a, b, error", [
    (model("a", 4, "[3]", "[8]"), model("b", 4, "[8]", "[2]"), None),
    (model("a", 4, "[3]", "[-1]"), model("b", 4, "[8]", "[2]"), None),               # -1 matches anything
    (model("a", 4, "[3]", "[8]"), model("b", 0, "[-1, 8]", "[-1, 2]"), None),         # non-batching, batch dim explicit
    (model("a", 4, "[3]", "[8]"), model("b", 4, "[4, 2]", "[2]"),
     "in ensemble e, ensemble tensor mid: inconsistent shape: [-1,8] is inferred from model a while [-1,4,2] is inferred from model b"),
    (model("a", 4, "[3]", "[8]"), model("b", 4, "[8]", "[3]"),
     "in ensemble e, ensemble tensor OUT: inconsistent shape: [-1,2] is inferred from model e while [-1,3] is inferred from model b"),
])
def test_shapes_must_agree(a, b, error):
    result = chain(4, "[3]", "[2]", {"a": a, "b": b})
    assert (result is None) if error is None else (error in result), result


def test_reshaped_ensemble_io_is_compared_by_its_reshape():
    specs = {"a": model("a", 0, "[6]", "[8]"), "b": model("b", 0, "[8]", "[2]")}
    cfg = parse('name: "e" platform: "ensemble" '
                'input [{ name: "IN" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [6] } }] '
                'output [{ name: "OUT" data_type: TYPE_FP32 dims: [2] }] '
                'ensemble_scheduling { step [ '
                '{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } }, '
                '{ model_name: "b" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } } ] }')
    assert validate_ensemble(cfg, specs) is None


def test_dependencies_are_read_from_the_config_file(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.pbtxt").write_text(
        'platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" }, { model_name: "b" }, '
        '{ model_name: "a" } ] }')
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "python"')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.pbtxt").write_text('platform: "ensemble" step {')
    (tmp_path / "none").mkdir()
    assert ensemble_dependencies(str(tmp_path / "e")) == ["a", "b"]
    for name in ("m", "bad", "none"):
        assert ensemble_dependencies(str(tmp_path / name)) is None
