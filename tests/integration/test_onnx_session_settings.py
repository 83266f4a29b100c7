"""An ONNX model's ONNX Runtime settings, read as Triton's onnxruntime backend reads them (qa/
L0_onnx_optimization's CPU checks): the memory and session parameters and the graph optimization
level are applied and logged in its words; a value it cannot parse, or an accelerator it does
not know, fails the load."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from onnx import TensorProto, helper, save

from conftest import TritondServer, expect_error, serving

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{extra}
"""

SETTINGS = """
parameters: { key: "enable_mem_arena" value: { string_value: "1" } }
parameters: { key: "enable_mem_pattern" value: { string_value: "0" } }
parameters: { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }
parameters: { key: "session.use_device_allocator_for_initializers" value: { string_value: "1" } }
parameters: { key: "execution_mode" value: { string_value: "1" } }
optimization { graph { level: 2 } }
"""


def _model(repo: Path, name: str, extra: str) -> None:
    graph = helper.make_graph([helper.make_node("Add", ["INPUT", "INPUT"], ["OUTPUT"])], "double",
                              [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (repo / name / "1").mkdir(parents=True)
    save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


def test_onnx_runtime_settings_are_applied_and_bad_ones_refused(tmp_path):
    repo = tmp_path / "models"
    _model(repo, "tuned", SETTINGS)
    _model(repo, "bad_arena", 'parameters: { key: "enable_mem_arena" value: { string_value: "maybe" } }')
    _model(repo, "bad_mode", 'parameters: { key: "execution_mode" value: { string_value: "2" } }')
    _model(repo, "bad_accelerator",
           'optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "nope" } ] } }')
    with serving(TritondServer(repo, ["--model-control-mode=explicit", "--log-verbose=1"])) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        client.load_model("tuned")
        t = httpclient.InferInput("INPUT", [4], "FP32")
        t.set_data_from_numpy(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(client.infer("tuned", [t]).as_numpy("OUTPUT"), np.arange(4) * 2)
        for line in ("Configuring enable_mem_arena to 1", "Configuring enable_mem_pattern to 0",
                     "Configuring memory.enable_memory_arena_shrinkage to cpu:0",
                     "Configuring 'session.use_device_allocator_for_initializers' to '1' for 'tuned'"):
            assert line in s.log, line
        for name, why in (("bad_arena", "failed to convert 'maybe' to boolean value"),
                          ("bad_mode", "Expected values for  execution_mode are 0 or 1 but got 2 ."),
                          ("bad_accelerator", "unknown Execution Accelerator 'nope' is requested")):
            expect_error(lambda: client.load_model(name), 400, why)
            assert not client.is_model_ready(name)
