"""The PyTorch backend on the CPU, driven directly: Triton's tensor-name binding rules,
TorchScript and torch.export models, batching, zero-copy inputs and the load errors."""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest

from tritond.repository.view import model_view
from tritond.workers.backends import create
from tritond.workers.backends.base import InstanceInfo, WorkerRequest
from tritond.workers.backends.pytorch import input_positions, named_index, output_positions

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

# TorchScript is deprecated upstream, yet it is what Triton's PyTorch backend serves.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ------------------------------------------------------------------ name binding (pure)

def test_named_index_follows_tritons_rule():
    assert named_index("INPUT__0") == 0
    assert named_index("OUTPUT__12") == 12
    assert named_index("INPUT0") is None
    assert named_index("a__b__1") is None      # text after the first '__' must be digits
    assert named_index("x__") is None


def test_input_positions_prefer_forward_arguments():
    assert input_positions(["y", "x"], ["x", "y"]) == {"y": 1, "x": 0}


def test_input_positions_fall_back_to_named_index_then_config_order():
    assert input_positions(["INPUT__1", "INPUT__0"], ["a", "b"]) == {"INPUT__1": 1, "INPUT__0": 0}
    assert input_positions(["B", "A"], ["a", "b"]) == {"B": 0, "A": 1}


def test_output_positions():
    assert output_positions(["OUT__1", "OUT__0"]) == {"OUT__1": 1, "OUT__0": 0}
    assert output_positions(["SUM", "DIFF"]) == {"SUM": 0, "DIFF": 1}


# ------------------------------------------------------------------ models

class AddSub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return x + y, x - y


class DictIn(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]):
        return inputs["A"] * 2 + inputs["B"]


class Upper(torch.nn.Module):
    def forward(self, words: List[str]) -> List[str]:
        return [w.upper() for w in words]


class Sequence(torch.nn.Module):
    def forward(self, value: torch.Tensor, start: torch.Tensor, ready: torch.Tensor):
        return value + start + ready


class InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        x.add_(1)
        return x.clone()


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def forward(self, x: torch.Tensor):
        return self.net(x)


def tensor(name: str, dtype: str, dims: list[int]) -> dict:
    return {"name": name, "data_type": dtype, "dims": dims}


def make(tmp_path, module, inputs, outputs, *, max_batch_size=0, filename="model.pt", kind="CPU", params=None,
         export_args=None, dynamic=None, extra=None):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True, exist_ok=True)
    if filename.endswith(".pt2"):
        program = torch.export.export(module, export_args, dynamic_shapes=dynamic)
        torch.export.save(program, str(version / filename))
    else:
        torch.jit.save(torch.jit.script(module), str(version / filename))
    config = {"name": "m", "platform": "pytorch_libtorch", "backend": "pytorch", "max_batch_size": max_batch_size,
              "input": inputs, "output": outputs, "default_model_filename": filename,
              "parameters": {k: {"string_value": v} for k, v in (params or {}).items()}, **(extra or {})}
    info = InstanceInfo("m", 1, str(tmp_path / "m"), str(version), "m_0_0", kind=kind)
    backend = create(config, model_view(config), info)
    return backend


def run(backend, *requests: dict, outputs: list[str] | None = None):
    reqs = [WorkerRequest(dict(r), list(outputs or [])) for r in requests]
    responses = backend.execute(reqs)
    assert all(r.error is None for r in responses)
    return [r.outputs for r in responses]


def fp32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_forward_argument_names_bind_inputs(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("y", "TYPE_FP32", [4]), tensor("x", "TYPE_FP32", [4])],
                   [tensor("SUM", "TYPE_FP32", [4]), tensor("DIFF", "TYPE_FP32", [4])])
    backend.load()
    x, y = fp32(4), fp32(4, seed=1)
    (out,) = run(backend, {"x": x, "y": y})
    np.testing.assert_allclose(out["SUM"], x + y, rtol=1e-6)
    np.testing.assert_allclose(out["DIFF"], x - y, rtol=1e-6)


def test_named_index_binds_inputs_and_outputs_whatever_the_config_order(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("INPUT__1", "TYPE_FP32", [4]), tensor("INPUT__0", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__1", "TYPE_FP32", [4]), tensor("OUTPUT__0", "TYPE_FP32", [4])])
    backend.load()
    x, y = fp32(4), fp32(4, seed=1)
    (out,) = run(backend, {"INPUT__0": x, "INPUT__1": y})
    np.testing.assert_allclose(out["OUTPUT__0"], x + y, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT__1"], x - y, rtol=1e-6)


def test_other_names_bind_in_config_order(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("FIRST", "TYPE_FP32", [4]), tensor("SECOND", "TYPE_FP32", [4])],
                   [tensor("A", "TYPE_FP32", [4]), tensor("B", "TYPE_FP32", [4])])
    backend.load()
    x, y = fp32(4), fp32(4, seed=1)
    (out,) = run(backend, {"SECOND": y, "FIRST": x})
    np.testing.assert_allclose(out["A"], x + y, rtol=1e-6)
    np.testing.assert_allclose(out["B"], x - y, rtol=1e-6)


def test_requested_outputs_only(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4]), tensor("OUTPUT__1", "TYPE_FP32", [4])])
    backend.load()
    (out,) = run(backend, {"x": fp32(4), "y": fp32(4)}, outputs=["OUTPUT__1"])
    assert list(out) == ["OUTPUT__1"]


def test_dict_input(tmp_path):
    backend = make(tmp_path, DictIn(), [tensor("A", "TYPE_FP32", [3]), tensor("B", "TYPE_FP32", [3])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [3])])
    backend.load()
    a, b = fp32(3), fp32(3, seed=1)
    (out,) = run(backend, {"A": a, "B": b})
    np.testing.assert_allclose(out["OUTPUT__0"], a * 2 + b, rtol=1e-6)


def test_string_list_in_and_out(tmp_path):
    backend = make(tmp_path, Upper(), [tensor("INPUT__0", "TYPE_STRING", [-1])],
                   [tensor("OUTPUT__0", "TYPE_STRING", [-1])])
    backend.load()
    words = np.array([b"abc", "d\u00e9f".encode()], dtype=object)
    (out,) = run(backend, {"INPUT__0": words})
    assert list(out["OUTPUT__0"]) == [b"ABC", "D\u00e9F".encode()]   # TorchScript upper() is ASCII-only


def test_mlp_matches_the_module_and_batches(tmp_path):
    module = Mlp().eval()
    backend = make(tmp_path, module, [tensor("INPUT__0", "TYPE_FP32", [8])], [tensor("OUTPUT__0", "TYPE_FP32", [4])],
                   max_batch_size=8)
    backend.load()
    parts = [fp32(1, 8, seed=1), fp32(3, 8, seed=2), fp32(2, 8, seed=3)]
    outs = run(backend, *({"INPUT__0": p} for p in parts))
    with torch.no_grad():
        for p, out in zip(parts, outs):
            expected = module(torch.from_numpy(p)).numpy()
            assert out["OUTPUT__0"].shape == expected.shape
            np.testing.assert_allclose(out["OUTPUT__0"], expected, rtol=1e-5, atol=1e-6)


def test_writable_inputs_are_used_in_place(tmp_path):
    backend = make(tmp_path, InPlace(), [tensor("INPUT__0", "TYPE_FP32", [4])], [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    backend.load()
    x = np.zeros(4, dtype=np.float32)
    (out,) = run(backend, {"INPUT__0": x})
    np.testing.assert_array_equal(out["OUTPUT__0"], np.ones(4))
    np.testing.assert_array_equal(x, np.ones(4))    # the model saw x's memory, not a copy


def test_read_only_inputs_are_copied_not_faulted(tmp_path):
    backend = make(tmp_path, InPlace(), [tensor("INPUT__0", "TYPE_FP32", [4])], [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    backend.load()
    raw = np.arange(4, dtype=np.float32).tobytes()
    x = np.frombuffer(raw, dtype=np.float32)           # read-only, like an inline request tensor
    assert not x.flags.writeable
    (out,) = run(backend, {"INPUT__0": x})
    np.testing.assert_array_equal(out["OUTPUT__0"], np.arange(4) + 1)
    assert np.frombuffer(raw, dtype=np.float32).tolist() == [0, 1, 2, 3]


def test_int_and_bf16_inputs(tmp_path):
    class Cast(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor):
            return a * 2, b.float()

    backend = make(tmp_path, Cast(), [tensor("INPUT__0", "TYPE_INT64", [3]), tensor("INPUT__1", "TYPE_BF16", [2])],
                   [tensor("OUTPUT__0", "TYPE_INT64", [3]), tensor("OUTPUT__1", "TYPE_FP32", [2])])
    backend.load()
    bits = torch.tensor([1.5, -2.0], dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    (out,) = run(backend, {"INPUT__0": np.array([1, 2, 3], dtype=np.int64), "INPUT__1": bits})
    assert out["OUTPUT__0"].tolist() == [2, 4, 6]
    assert out["OUTPUT__1"].tolist() == [1.5, -2.0]


def test_exported_program_pt2(tmp_path):
    module = Mlp().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    backend = make(tmp_path, module, [tensor("x", "TYPE_FP32", [8])], [tensor("OUTPUT__0", "TYPE_FP32", [4])],
                   max_batch_size=8, filename="model.pt2", export_args=(torch.zeros(2, 8),), dynamic=({0: batch},))
    backend.load()
    parts = [fp32(1, 8, seed=4), fp32(4, 8, seed=5)]
    outs = run(backend, *({"x": p} for p in parts))
    with torch.no_grad():
        for p, out in zip(parts, outs):
            np.testing.assert_allclose(out["OUTPUT__0"], module(torch.from_numpy(p)).numpy(), rtol=1e-5, atol=1e-6)


def test_sequence_control_inputs_are_model_inputs(tmp_path):
    """qa's libtorch_sequence_*: forward(input, start, ready) with only INPUT__0 under `input`."""
    controls = [{"name": name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
                for name, kind in (("START__1", "CONTROL_SEQUENCE_START"), ("READY__2", "CONTROL_SEQUENCE_READY"))]
    backend = make(tmp_path, Sequence(), [tensor("INPUT__0", "TYPE_INT32", [1])],
                   [tensor("OUTPUT__0", "TYPE_INT32", [1])], extra={"sequence_batching": {"control_input": controls}})
    backend.load()
    one = np.array([1], dtype=np.int32)
    (out,) = run(backend, {"INPUT__0": np.array([5], dtype=np.int32), "START__1": one, "READY__2": one})
    assert out["OUTPUT__0"].tolist() == [7]


class Accumulate(torch.nn.Module):
    def forward(self, value: torch.Tensor, state: torch.Tensor):
        total = value + state
        return total, total * 10


def test_implicit_state_output_binds_by_its_index(tmp_path):
    """qa's libtorch implicit-state models (and L0_request_cancellation's sequence_state): the state
    output OUTPUT_STATE__1 is no config output, yet it is element 1 of what forward returns."""
    state = {"input_name": "INPUT_STATE__1", "output_name": "OUTPUT_STATE__1", "data_type": "TYPE_INT32",
             "dims": [1]}
    backend = make(tmp_path, Accumulate(), [tensor("INPUT__0", "TYPE_INT32", [1])],
                   [tensor("OUTPUT__0", "TYPE_INT32", [1])],
                   extra={"sequence_batching": {"direct": {}, "state": [state]}})
    backend.load()
    (out,) = run(backend, {"INPUT__0": np.array([2], np.int32), "INPUT_STATE__1": np.array([3], np.int32)},
                 outputs=["OUTPUT__0", "OUTPUT_STATE__1"])
    assert (out["OUTPUT__0"].tolist(), out["OUTPUT_STATE__1"].tolist()) == ([5], [50])


# ------------------------------------------------------------------ errors

def test_input_count_mismatch(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4])], [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    with pytest.raises(ValueError, match="configuration expects 1 inputs, model provides 2"):
        backend.load()


def test_config_without_inputs_is_refused_by_the_input_count(tmp_path):
    """As Triton's PyTorch backend (L0_model_config's pytorch/too_few_inputs)."""
    backend = make(tmp_path, AddSub(), [], [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    with pytest.raises(ValueError, match="configuration expects 0 inputs, model provides 2"):
        backend.load()


def test_unsupported_correlation_id_type(tmp_path):
    """A CORRID control is a model input, so its type must be one PyTorch has (L0_libtorch_io_types)."""
    corrid = {"name": "CORRID__2", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT32"}]}
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4])],
                   extra={"sequence_batching": {"direct": {}, "control_input": [corrid]}})
    with pytest.raises(ValueError, match="input 'CORRID__2' type 'TYPE_UINT32' is not supported by PyTorch."):
        backend.load()


def test_unsupported_datatype(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_UINT32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    with pytest.raises(ValueError, match="unsupported datatype TYPE_UINT32 for input 'x'"):
        backend.load()


def test_output_datatype_mismatch_fails_the_batch(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_INT32", [4])])
    backend.load()
    with pytest.raises(RuntimeError, match="configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', "
                                           "model provides TYPE_FP32"):
        backend.execute([WorkerRequest({"x": fp32(4), "y": fp32(4)}, [])])


def test_output_index_out_of_range(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__5", "TYPE_FP32", [4])])
    backend.load()
    with pytest.raises(RuntimeError, match="refers to an output index which doesn't exist. This model has 2 outputs"):
        backend.execute([WorkerRequest({"x": fp32(4), "y": fp32(4)}, [])])


def test_model_exception_is_an_execute_failure(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    backend.load()
    with pytest.raises(RuntimeError, match="PyTorch execute failure"):
        backend.execute([WorkerRequest({"x": fp32(4), "y": fp32(3)}, [])])


def test_missing_model_file(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4])])
    backend.config["default_model_filename"] = "other.pt"
    with pytest.raises(FileNotFoundError, match="other.pt"):
        backend.load()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_gpu_instance_without_a_gpu_fails_clearly(tmp_path):
    backend = make(tmp_path, AddSub(), [tensor("x", "TYPE_FP32", [4]), tensor("y", "TYPE_FP32", [4])],
                   [tensor("OUTPUT__0", "TYPE_FP32", [4])], kind="GPU")
    with pytest.raises(RuntimeError, match="KIND_GPU instance requested but PyTorch cannot use a GPU"):
        backend.load()
