import onnx
import pytest
from onnx import TensorProto, helper

from tritond.repository import devices
from tritond.repository.catalog import check_repository, load_spec
from tritond.repository.layout import ModelSource, scan


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_onnx(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture
def repo(tmp_path):
    write_onnx(tmp_path / "ident" / "1" / "model.onnx")
    write(tmp_path / "py" / "1" / "model.py")
    write(tmp_path / "py" / "2" / "model.py")
    write(
        tmp_path / "py" / "config.pbtxt",
        'backend: "python"\nversion_policy { all {} }\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [-1] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [-1] }]',
    )
    write(tmp_path / "bad" / "1" / "model.py")
    write(tmp_path / "bad" / "config.pbtxt", 'backend: "python"\nmax_batch_size: [')
    write(tmp_path / "empty" / "config.pbtxt", 'backend: "python"')
    write(tmp_path / "ens" / "1" / ".keep")
    write(
        tmp_path / "ens" / "config.pbtxt",
        'platform: "ensemble"\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]\n'
        'ensemble_scheduling { step [{ model_name: "ident" input_map { key: "x" value: "IN" } '
        'output_map { key: "y" value: "OUT" } }] }',
    )
    write(tmp_path / "ens_bad" / "1" / ".keep")
    write(
        tmp_path / "ens_bad" / "config.pbtxt",
        'platform: "ensemble"\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]\n'
        'ensemble_scheduling { step [{ model_name: "bad" input_map { key: "x" value: "IN" } '
        'output_map { key: "y" value: "OUT" } }] }',
    )
    return tmp_path


def test_check_repository_reports_bad_models_beside_good_ones(repo):
    specs = {s.name: s for s in check_repository([str(repo)])}
    assert list(specs) == sorted(specs)
    assert specs["ident"].error == "" and specs["ident"].versions == [1]
    assert specs["ident"].config.max_batch_size == 4
    assert specs["py"].error == "" and specs["py"].versions == [1, 2]
    assert specs["py"].advice and "input 'x'" in specs["py"].advice[0]
    assert specs["ens"].error == "" and specs["ens"].versions == [1]

    bad = specs["bad"]
    assert bad.config is None and bad.versions == []
    assert bad.error.startswith(f"model 'bad', file '{repo}/bad/config.pbtxt', field 'max_batch_size': line 2")
    assert specs["empty"].error == "no version is available"
    assert "ensemble 'ens_bad' depends on 'bad' which has no loaded version" in specs["ens_bad"].error


def test_duplicate_model_across_repositories(tmp_path):
    for r in ("r1", "r2"):
        write(tmp_path / r / "m" / "1" / "model.py")
    write(tmp_path / "r2" / "solo" / "1" / "model.py")
    specs = {s.name: s for s in check_repository([str(tmp_path / "r1"), str(tmp_path / "r2")])}
    assert specs["m"].error == "model 'm' appears in multiple repositories"
    assert specs["solo"].error == ""


def test_load_spec_never_raises(tmp_path):
    write(tmp_path / " .." / "1" / "model.py")
    source = scan([str(tmp_path)])[" .."]
    assert "path traversal" in load_spec(source).error
    missing = ModelSource("gone", str(tmp_path / "gone"), str(tmp_path))
    assert "Could not determine backend" in load_spec(missing).error


def test_a_model_without_versions_says_which_directories_it_ignored(tmp_path):
    write(tmp_path / "m" / "01" / "model.py")
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m" backend: "python"')
    spec = load_spec(scan([str(tmp_path)])["m"])
    assert spec.error and not spec.versions
    # Triton warns of them while it lists the versions, before the load fails
    assert spec.advice == ["ignore version directory '01' which contains leading zeros in its directory name"]
