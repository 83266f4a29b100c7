"""ONNX Runtime writes a request's outputs straight into the client's shared-memory region
(output binding) when the model fixes their shape or names their dims as an input's, so the
worker has no copy left to make;
otherwise, and when the region overlaps an input, it runs as usual."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.repository.view import model_view
from tritond.workers.backends import create
from tritond.workers.backends.base import InstanceInfo, WorkerRequest


def save_model(path, batch_dim, width) -> None:
    """OUTPUT0 = INPUT0 + 1 and COPY = INPUT0, both [batch_dim, width]."""
    import onnx
    from onnx import TensorProto, helper
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "one"], ["OUTPUT0"]), helper.make_node("Identity", ["INPUT0"], ["COPY"])],
        "g", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [batch_dim, width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [batch_dim, width]),
         helper.make_tensor_value_info("COPY", TensorProto.FLOAT, [batch_dim, width])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))


def backend(tmp_path, max_batch_size: int = 8, width: int | str | None = 4):
    """width: fixed, named (a dim_param shared by the input and the outputs) or None (open)."""
    path = tmp_path / "m"
    save_model(path, "batch" if max_batch_size else 2, width)
    w = width if type(width) is int else -1
    dims = [w] if max_batch_size else [2, w]
    config = {"name": "m", "platform": "onnxruntime_onnx", "max_batch_size": max_batch_size,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": dims}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": dims},
                         {"name": "COPY", "data_type": "TYPE_FP32", "dims": dims}]}
    b = create(config, model_view(config), InstanceInfo("m", 1, str(path), str(path / "1"), "m_0_0"))
    b.load()
    return b


def region(nbytes: int) -> memoryview:
    return memoryview(bytearray(nbytes))


def test_a_fixed_shape_output_is_computed_in_the_clients_region(tmp_path):
    b = backend(tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = region(64)                    # a region may be larger than the output
    (r,) = b.execute([WorkerRequest({"INPUT0": x}, [], output_buffers={"OUTPUT0": out})])
    y = r.outputs["OUTPUT0"]
    assert np.shares_memory(y, np.frombuffer(out, np.uint8))
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(np.frombuffer(out, np.float32)[:8].reshape(2, 4), x + 1)
    # an output without a region is ONNX Runtime's own allocation
    assert not np.shares_memory(r.outputs["COPY"], y) and np.array_equal(r.outputs["COPY"], x)


def test_a_non_batching_model_binds_too(tmp_path):
    b = backend(tmp_path, max_batch_size=0)
    x = np.ones((2, 4), np.float32)
    out = region(32)
    (r,) = b.execute([WorkerRequest({"INPUT0": x}, ["OUTPUT0"], output_buffers={"OUTPUT0": out})])
    assert list(r.outputs) == ["OUTPUT0"] and np.shares_memory(r.outputs["OUTPUT0"], np.frombuffer(out, np.uint8))


@pytest.mark.parametrize("case", ["small region", "overlaps the input", "open dims", "batch of two requests"])
def test_otherwise_the_output_is_onnx_runtimes_own(tmp_path, case):
    b = backend(tmp_path, width=None if case == "open dims" else 4)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = region(16 if case == "small region" else 32)
    if case == "overlaps the input":
        x = np.frombuffer(out, np.float32).reshape(2, 4)
        x[:] = np.arange(8).reshape(2, 4)
    reqs = [WorkerRequest({"INPUT0": x}, [], output_buffers={"OUTPUT0": out})]
    if case == "batch of two requests":
        reqs.append(WorkerRequest({"INPUT0": x}, []))
    expected = x + 1
    results = b.execute(reqs)
    for r in results:
        np.testing.assert_array_equal(r.outputs["OUTPUT0"], expected)
        assert not np.shares_memory(r.outputs["OUTPUT0"], np.frombuffer(out, np.uint8))


@pytest.mark.parametrize("max_batch_size", [8, 0])
def test_an_output_whose_dims_are_named_as_an_inputs_is_bound_to_the_inputs_size(tmp_path, max_batch_size):
    b = backend(tmp_path, max_batch_size=max_batch_size, width="W")
    for width in (3, 5):                # the size comes from each request's input
        x = np.arange(2 * width, dtype=np.float32).reshape(2, width)
        out = region(4 * 2 * width + 8)
        (r,) = b.execute([WorkerRequest({"INPUT0": x}, [], output_buffers={"OUTPUT0": out})])
        y = r.outputs["OUTPUT0"]
        assert y.shape == (2, width) and np.shares_memory(y, np.frombuffer(out, np.uint8))
        np.testing.assert_array_equal(y, x + 1)
