"""Explicit model control through the repository API: a load carrying `config` reloads the
model with that config; `file:` overrides are refused clearly rather than ignored."""
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer

MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''
CONFIG = '''name: "echo"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
'''


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    repo = tmp_path_factory.mktemp("control") / "models"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(MODEL_PY)
    s = TritondServer(repo, ["--model-control-mode=explicit", "--load-model=echo"]).start()
    yield httpclient.InferenceServerClient(s.http_url)
    assert s.stop() == 0
    s.assert_clean()


def error_of(call) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value)


def test_load_with_config_reloads_with_it(explicit):
    assert explicit.get_model_config("echo")["max_batch_size"] == 0
    config = {
        "name": "echo", "backend": "python", "max_batch_size": 8, "dynamic_batching": {},
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    explicit.load_model("echo", config=json.dumps(config))
    assert explicit.get_model_config("echo")["max_batch_size"] == 8
    x = np.ones((2, 3), np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(explicit.infer("echo", [inp]).as_numpy("OUTPUT0"), x)
    explicit.load_model("echo")             # without parameters: already loaded, nothing changes
    assert explicit.get_model_config("echo")["max_batch_size"] == 8


def test_file_overrides_and_bad_configs_are_refused(explicit):
    assert "Load parameter 'config' must be specified for model file override" in error_of(
        lambda: explicit.load_model("echo", files={"file:1/model.py": b"x"}))
    assert "not supported" in error_of(
        lambda: explicit.load_model("echo", config="{}", files={"file:1/model.py": b"x"}))
    assert "failed to load 'echo', Invalid config override" in error_of(
        lambda: explicit.load_model("echo", config="{not json"))
    assert "failed to load 'nope', failed to poll from model repository" in error_of(
        lambda: explicit.load_model("nope"))
    assert explicit.is_model_ready("echo")
