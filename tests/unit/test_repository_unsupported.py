"""A config that asks for something tritond does not implement fails to load with the field
named, one row per entry of repository/unsupported.py (an entry that leaves the table when
its feature lands takes its row along); model file names stay inside the model; `tritond
check` also catches a model.py that does not compile and a repository path that is not a
directory."""
from __future__ import annotations

import pytest

from tritond.check import check
from tritond.repository import devices
from tritond.repository.catalog import load_spec
from tritond.repository.layout import ModelSource
from tritond.repository.unsupported import BACKEND_PARAMETERS, FIELDS, PARAMETERS, unsupported

BASE = ('backend: "python" max_batch_size: 4 '
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ 2 ] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2 ] }] ')

# One config fragment that sets each field of the table.
EXAMPLES = {
    "instance_group.host_policy": 'instance_group [{ kind: KIND_CPU host_policy: "numa0" }]',
    "instance_group.passive": "instance_group [{ kind: KIND_CPU passive: true }]",
    "model_repository_agents": 'model_repository_agents { agents [{ name: "checksum" }] }',
    "model_operations": 'model_operations { op_library_filename: "libops.so" }',
    "ensemble_scheduling.step.model_namespace": None,   # an ensemble of its own
}
NAMESPACED = ('platform: "ensemble" max_batch_size: 4 '
              'input [{ name: "x" data_type: TYPE_FP32 dims: [ 2 ] }] '
              'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2 ] }] '
              'ensemble_scheduling { step [{ model_name: "m" model_version: -1 model_namespace: "ns" '
              'input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } }] }')


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def model(root, config: str, name: str = "m", source: str = "") -> ModelSource:
    path = root / name
    (path / "1").mkdir(parents=True)
    (path / "1" / "model.py").write_text(source)
    (path / "config.pbtxt").write_text(config)
    return ModelSource(name, str(path), str(root))


def config_setting(field: str) -> str:
    if field == "ensemble_scheduling.step.model_namespace":
        return NAMESPACED
    return BASE + EXAMPLES[field]


def test_a_plain_model_loads(tmp_path):
    assert load_spec(model(tmp_path, BASE)).error == ""


@pytest.mark.parametrize("field", list(FIELDS))
def test_an_unsupported_field_fails_the_load_naming_it(tmp_path, field):
    assert field in EXAMPLES, f"add an example config for '{field}'"
    error = load_spec(model(tmp_path, config_setting(field))).error
    assert f"field '{field}': '{field}' ({FIELDS[field]}) is not supported by tritond yet" in error


@pytest.mark.parametrize("key", list(PARAMETERS))
def test_an_unsupported_parameter_fails_the_load_naming_it(tmp_path, key):
    config = BASE + f'parameters {{ key: "{key}" value: {{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }} }}'
    error = load_spec(model(tmp_path, config)).error
    assert f"field 'parameters.{key}': parameter '{key}' ({PARAMETERS[key]}) is not supported" in error


@pytest.mark.parametrize("backend, key", [(b, k) for b, keys in BACKEND_PARAMETERS.items() for k in keys])
def test_a_backends_unsupported_parameter_fails_only_its_models(tmp_path, backend, key):
    from tritonclient.grpc import model_config_pb2
    cfg = model_config_pb2.ModelConfig(name="m", backend=backend)
    cfg.parameters[key].string_value = "true"
    assert unsupported(cfg) == (f"parameters.{key}", f"parameter '{key}' ({BACKEND_PARAMETERS[backend][key]}) is "
                                                     "not supported by tritond yet")
    config = BASE + f'parameters {{ key: "{key}" value: {{ string_value: "true" }} }}'
    assert load_spec(model(tmp_path, config)).error == ""        # a python model: ignored, as by Triton


def test_a_model_py_that_does_not_compile_fails_the_load(tmp_path):
    source = model(tmp_path, BASE, source="class TritonPythonModel:\n    def execute(self, requests)\n")
    error = load_spec(source).error
    assert "model.py" in error and "does not compile: line 2: expected ':'" in error


def test_check_reports_a_model_py_that_does_not_compile(tmp_path, capsys):
    model(tmp_path, BASE, source="def broken(:\n")
    model(tmp_path, BASE, name="good")
    assert check([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "m: UNAVAILABLE" in out and "does not compile: line 1" in out and "good: OK" in out


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_check_says_in_one_line_when_the_repository_is_not_a_directory(tmp_path, capsys, kind):
    path = tmp_path / "repo"
    if kind == "file":
        path.write_text("")
    assert check([str(path)]) == 1
    err = capsys.readouterr().err.strip()
    what = "does not exist" if kind == "missing" else "is not a directory"
    assert err == f"tritond check: model repository '{path}' {what}"


@pytest.mark.parametrize("filename", ["../../other/1/model.py", "/etc/passwd", "sub/../../x.py"])
def test_a_model_file_name_that_leaves_the_version_directory_is_refused(tmp_path, filename):
    """A config can arrive over the network (a load's `config` parameter): its file names must
    not reach outside the model, not even for auto-complete to read."""
    error = load_spec(model(tmp_path, BASE + f'default_model_filename: "{filename}"')).error
    assert f"field 'default_model_filename': '{filename}' must name a file inside the model's version directory" \
        in error
