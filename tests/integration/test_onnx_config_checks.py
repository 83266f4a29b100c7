"""An ONNX model's config checked against its graph as Triton's ONNX Runtime backend checks it
at load: an input the graph declares without a shape is a scalar to ONNX Runtime, so its config
dims may only be 1 (qa/L0_scalar_io refuses a scalar model configured with dims [2])."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, save

from conftest import TritondServer, expect_error, serving

SCALAR_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: {dims} }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: {dims} }} ]
"""


def scalar_model(repo: Path, name: str, dims: str) -> None:
    """An identity graph whose input and output declare no shape, with `dims` in its config."""
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT"], ["OUTPUT"])], "scalar",
                              [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (repo / name / "1").mkdir(parents=True)
    save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(SCALAR_CONFIG.format(name=name, dims=dims))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnx_checks") / "models"
    scalar_model(repo, "scalar_1", "[ 1 ]")
    scalar_model(repo, "scalar_2", "[ 2 ]")
    with serving(TritondServer(repo, ["--model-control-mode=explicit"])) as s:
        c = httpclient.InferenceServerClient(s.http_url, network_timeout=120)
        yield c
        c.close()


def test_a_shapeless_input_configured_with_dims_of_one_serves(client):
    client.load_model("scalar_1")
    t = httpclient.InferInput("INPUT", [1], "FP32")
    t.set_data_from_numpy(np.array([2.5], np.float32))
    np.testing.assert_array_equal(client.infer("scalar_1", [t]).as_numpy("OUTPUT"), [2.5])


def test_a_shapeless_input_configured_with_other_dims_is_refused(client):
    expect_error(lambda: client.load_model("scalar_2"), 400,
                 "unable to load model 'scalar_2', scalar tensor 'INPUT', should only provide 1 in the model "
                 "configuration when the model doesn't support batching. Model configuration provided: [2].")
    assert not client.is_model_ready("scalar_2")
