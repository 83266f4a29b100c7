"""Python-based backends, as Triton has them (L0_backend_python python_based_backends): a config
naming a backend whose directory under --backend-directory holds model.py runs on the Python
backend with that model.py; the model's versions hold only what the backend reads."""
from __future__ import annotations

import json

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, expect_error, serving

BACKEND = """
import json
import os

import triton_python_backend_utils as pb_utils
from add_sub_ops import OPERATIONS


class TritonPythonModel:
    \"\"\"Adds or subtracts, as the version's model.json says.\"\"\"

    @staticmethod
    def auto_complete_config(config):
        for name in ("INPUT0", "INPUT1"):
            config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.op = OPERATIONS[json.load(f)["operation"]]
        self.version = args["model_version"]

    def execute(self, requests):
        out = []
        for r in requests:
            a, b = (pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in ("INPUT0", "INPUT1"))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", self.op(a, b).astype("float32"))]))
        return out
"""


def _repository(tmp_path):
    backends = tmp_path / "backends"
    (backends / "add_sub").mkdir(parents=True)
    (backends / "add_sub" / "model.py").write_text(BACKEND)
    (backends / "add_sub" / "add_sub_ops.py").write_text(     # beside model.py, importable as in Triton
        "import operator\nOPERATIONS = {'add': operator.add, 'sub': operator.sub}\n")
    (backends / "broken").mkdir()
    (backends / "broken" / "model.py").write_text("def (:\n")
    models = tmp_path / "models"
    for name, versions in (("add", (1, 2)), ("sub", (1,))):
        for v in versions:
            (models / name / str(v)).mkdir(parents=True)
            (models / name / str(v) / "model.json").write_text(json.dumps({"operation": name}))
        (models / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    for name, config in (("nowhere", 'backend: "no_such_backend"\n'),
                         ("broken", 'backend: "broken"\n'),
                         ("torch_runtime", 'backend: "pytorch"\nruntime: "model.py"\n')):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
    return backends, models


def _infer(client, model: str, version: str = "") -> np.ndarray:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, dtype=np.float32)
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(model, inputs, model_version=version).as_numpy("OUTPUT")


def test_a_backend_directory_holding_model_py_runs_its_models(tmp_path):
    backends, models = _repository(tmp_path)
    args = [f"--backend-directory={backends}", "--model-control-mode=explicit"]
    with serving(TritondServer(models, args)) as s:
        http = httpclient.InferenceServerClient(s.http_url)
        grpc = grpcclient.InferenceServerClient(s.grpc_url)
        grpc.load_model("add", config='{"backend":"add_sub","version_policy":{"latest":{"num_versions":2}}}')
        http.load_model("sub")
        for version in ("1", "2"):
            assert http.is_model_ready("add", version)
            np.testing.assert_array_equal(_infer(http, "add", version), np.arange(4) + 10)
        np.testing.assert_array_equal(_infer(http, "sub"), np.arange(4) - 10)
        config = http.get_model_config("sub")
        assert (config["backend"], config["runtime"]) == ("add_sub", "model.py")
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"], "auto_complete_config ran"
        assert http.get_model_metadata("sub")["platform"] == "add_sub"
        expect_error(lambda: http.load_model("nowhere"), 400,
                     "unable to find backend library for backend 'no_such_backend', try specifying runtime "
                     "on the model configuration")
        expect_error(lambda: http.load_model("broken"), 400, f"{backends / 'broken' / 'model.py'}")
        expect_error(lambda: http.load_model("torch_runtime"), 400,
                     f"unable to find Python backend based backend library 'model.py' for model "
                     f"'torch_runtime', searched: '{backends / 'pytorch' / 'model.py'}'")
        grpc.close()


def test_without_the_directory_the_backend_is_unknown(tmp_path):
    _, models = _repository(tmp_path)
    with serving(TritondServer(models, ["--model-control-mode=explicit"])) as s:
        expect_error(lambda: httpclient.InferenceServerClient(s.http_url).load_model("add"), 400,
                     "unable to find backend library for backend 'add_sub'")
