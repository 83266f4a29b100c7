"""Ragged batching: the worker's gather (flattened ragged inputs, batch inputs of every kind)
and scatter (batch outputs), and the config checks (Triton's ValidateBatchIO messages, the
backends that do it, a ragged input being 1-D in an ONNX model)."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.repository import devices
from tritond.repository.catalog import load_spec
from tritond.repository.layout import ModelSource
from tritond.repository.view import model_view
from tritond.workers.backends.base import WorkerRequest
from tritond.workers.backends.batching import concat_inputs, execute_batch
from tritond.workers.backends.ragged import RaggedPlan


def plan(config: dict) -> RaggedPlan | None:
    return RaggedPlan.from_config(model_view(config), config)


CONFIG = {
    "max_batch_size": 8,
    "input": [{"name": "RAGGED", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True},
              {"name": "PLAIN", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "SCATTERED", "data_type": "TYPE_FP32", "dims": [-1]},
               {"name": "PER_ITEM", "data_type": "TYPE_FP32", "dims": [2]}],
    "batch_output": [{"kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "target_name": ["SCATTERED"],
                      "source_input": ["RAGGED"]}],
}
KINDS = {
    "BATCH_ELEMENT_COUNT": [3, 8, 1],
    "BATCH_ACCUMULATED_ELEMENT_COUNT": [3, 11, 12],
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": [0, 3, 11, 12],
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE": [0] * 8,
    "BATCH_ITEM_SHAPE": [[3], [4], [4], [1]],
    "BATCH_ITEM_SHAPE_FLATTEN": [3, 4, 4, 1],
}


def requests() -> list[WorkerRequest]:
    shapes = [(1, 3), (2, 4), (1, 1)]
    return [WorkerRequest({"RAGGED": np.full(s, i, np.float32), "PLAIN": np.full((s[0], 2), i, np.float32)}, [])
            for i, s in enumerate(shapes)]


@pytest.mark.parametrize("kind, expected", KINDS.items())
def test_batch_inputs_describe_the_batch(kind, expected):
    config = dict(CONFIG, batch_input=[{"kind": kind, "target_name": ["B"], "data_type": "TYPE_INT32",
                                        "source_input": ["RAGGED"]}])
    inputs, sizes = plan(config).gather(requests(), concat_inputs)
    assert sizes == [1, 2, 1]
    assert inputs["B"].dtype == np.int32 and inputs["B"].tolist() == expected
    assert inputs["RAGGED"].tolist() == [0] * 3 + [1] * 8 + [2]
    assert inputs["PLAIN"].shape == (4, 2)


def test_batch_outputs_scatter_by_the_source_input_and_others_split_by_batch():
    seen = {}

    def run(inputs):
        seen.update(inputs)
        return {"SCATTERED": inputs["RAGGED"] * 10, "PER_ITEM": inputs["PLAIN"] + 1}
    responses = execute_batch(requests(), run, True, ragged=plan(CONFIG))
    assert [r.outputs["SCATTERED"].tolist() for r in responses] == [[[0] * 3], [[10] * 4] * 2, [[20]]]
    assert [r.outputs["PER_ITEM"].shape for r in responses] == [(1, 2), (2, 2), (1, 2)]
    # one request alone still goes to the model flattened
    (single,) = execute_batch(requests()[1:2], run, True, ragged=plan(CONFIG))
    assert seen["RAGGED"].shape == (8,) and single.outputs["SCATTERED"].shape == (2, 4)


def test_a_model_without_ragged_batching_has_no_plan():
    assert plan({"max_batch_size": 8, "input": [{"name": "x", "dims": [2]}]}) is None


BASE = ('max_batch_size: 4 input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }] '
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }] ')


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


def load_error(tmp_path, config: str, model_file: str = "model.py") -> str:
    path = tmp_path / "m"
    (path / "1").mkdir(parents=True)
    (path / "1" / model_file).write_text("")
    (path / "config.pbtxt").write_text(config)
    return load_spec(ModelSource("m", str(path), str(tmp_path))).error


@pytest.mark.parametrize("extra, message", [
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 }]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT64 source_input: "INPUT0" }]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "X" }]',
     "unknown source input name 'X'"),
    ('batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Y" source_input: "INPUT0" }]',
     "unknown target output name 'Y'"),
    ('batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["OUTPUT0", "OUTPUT0"] '
     'source_input: "INPUT0" }]', "target output name 'OUTPUT0' can only be specified once"),
])
def test_tritons_batch_io_checks(tmp_path, extra, message):
    assert message in load_error(tmp_path, 'backend: "pytorch" ' + BASE + extra, "model.pt")


def test_python_takes_ragged_inputs_but_no_batch_inputs(tmp_path):
    assert load_error(tmp_path, 'backend: "python" ' + BASE) == ""
    error = load_error(tmp_path / "b", 'backend: "python" ' + BASE + 'batch_input [{ kind: BATCH_ELEMENT_COUNT '
                       'target_name: "N" data_type: TYPE_INT32 source_input: "INPUT0" }]')
    assert "'batch_input/batch_output' (ragged batching) is not supported by tritond for the 'python' backend" \
        in error


def test_an_onnx_ragged_input_must_be_one_dimensional_in_the_model(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "g",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1, -1])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1, -1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    path = tmp_path / "m"
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))
    (path / "config.pbtxt").write_text('backend: "onnxruntime" ' + BASE)
    error = load_spec(ModelSource("m", str(path), str(tmp_path))).error
    assert "configuration expects model provides input with shape [-1]  for ragged input 'INPUT0', " \
           "model provides [-1,-1]" in error
