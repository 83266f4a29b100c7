"""The built-in `identity` backend (Triton's test backend): OUTPUT<i> copies INPUT<i> per
request, its config checks, optional inputs, and the per-instance execution delay."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.repository.view import model_view
from tritond.workers.backends import create
from tritond.workers.backends.base import InstanceInfo, WorkerRequest
from tritond.wire.errors import TritonError


def backend(config: dict, index: int = 0):
    config = {"backend": "identity", **config}
    b = create(config, model_view(config), InstanceInfo("m", 1, "/m", "/m/1", f"m_0_{index}", index=index))
    b.load()
    return b


def io(name: str, dtype: str = "TYPE_FP32", dims=(-1,), **extra) -> dict:
    return {"name": name, "data_type": dtype, "dims": list(dims), **extra}


def test_outputs_copy_inputs_request_by_request_in_their_own_shapes():
    b = backend({"max_batch_size": 8, "input": [io("INPUT0"), io("INPUT1", "TYPE_STRING")],
                 "output": [io("OUTPUT0"), io("OUTPUT1", "TYPE_STRING")]})
    a = np.arange(3, dtype=np.float32).reshape(1, 3)
    c = np.ones((2, 5), np.float32)
    s = np.array([[b"x"]], dtype=object)
    r1, r2 = b.execute([WorkerRequest({"INPUT0": a, "INPUT1": s}, []),
                        WorkerRequest({"INPUT0": c, "INPUT1": s}, ["OUTPUT0"])])
    assert r1.outputs["OUTPUT0"] is a and r1.outputs["OUTPUT1"] is s
    assert list(r2.outputs) == ["OUTPUT0"] and r2.outputs["OUTPUT0"].shape == (2, 5)


def test_an_absent_optional_input_gives_zeros_of_its_dims_behind_the_batch():
    b = backend({"max_batch_size": 4, "input": [io("INPUT0"), io("INPUT1", dims=(2, -1), optional=True)],
                 "output": [io("OUTPUT0"), io("OUTPUT1", dims=(2, -1))]})
    (r,) = b.execute([WorkerRequest({"INPUT0": np.ones((3, 4), np.float32)}, [])])
    np.testing.assert_array_equal(r.outputs["OUTPUT1"], np.zeros((3, 2, 1), np.float32))


@pytest.mark.parametrize("config, message", [
    ({"input": [io("INPUT0")], "output": []}, "model configuration must have equal input/output pairs"),
    ({"input": [io("X")], "output": [io("OUTPUT0")]}, "expected input name to follow INPUT<index> pattern"),
    ({"input": [io("INPUT0")], "output": [io("OUTPUT1")]}, "expected input and output indices to match"),
    ({"input": [io("INPUT0")], "output": [io("OUTPUT0", "TYPE_INT32")]},
     "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32"),
    ({"input": [io("INPUT0", dims=(2,))], "output": [io("OUTPUT0", dims=(3,))]},
     "expected input and output shape to match"),
    ({"input": [io("INPUT0")], "output": [io("OUTPUT0")],
      "parameters": {"execute_delay_ms": {"string_value": "soon"}}}, "'execute_delay_ms' must be an integer"),
    ({"input": [io("INPUT0")], "output": [io("OUTPUT0")],
      "parameters": {"enable_custom_tracing": {"string_value": "true"}}}, "'enable_custom_tracing'"),
])
def test_configs_the_identity_backend_refuses(config, message):
    with pytest.raises(TritonError, match=message):
        backend(config)


@pytest.mark.parametrize("index, multiplier, delay_s", [(0, "", 0.1), (2, "", 0.1), (0, "4", 0.1), (2, "4", 0.8)])
def test_execution_delay_scales_with_the_instance_index(index, multiplier, delay_s):
    params = {"execute_delay_ms": {"string_value": "100"}}
    if multiplier:
        params["instance_wise_delay_multiplier"] = {"string_value": multiplier}
    b = backend({"input": [io("INPUT0")], "output": [io("OUTPUT0")], "parameters": params}, index)
    assert b.delay_s == pytest.approx(delay_s)
