"""The TensorRT backend without TensorRT: config checks, profile selection, and the reason a
model gets when the library is missing (engine execution is covered only on a GPU host)."""
from __future__ import annotations

import importlib.util

import pytest

from tritond.repository.view import model_view
from tritond.workers.backends import create
from tritond.workers.backends.base import InstanceInfo
from tritond.workers.backends.tensorrt import select_profile, validate_config

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def config(**fields) -> dict:
    base = {"name": "plan", "platform": "tensorrt_plan", "backend": "tensorrt", "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}
    base.update(fields)
    return base


def test_supported_types_pass():
    validate_config(config(), "plan")


@pytest.mark.parametrize("dtype", ["TYPE_STRING", "TYPE_FP64", "TYPE_UINT32", "TYPE_INT16"])
def test_unsupported_types_are_rejected(dtype):
    cfg = config(output=[{"name": "OUTPUT0", "data_type": dtype, "dims": [16]}])
    with pytest.raises(ValueError, match=f"unsupported datatype {dtype} for output 'OUTPUT0' of TensorRT model"):
        validate_config(cfg, "plan")


def test_profile_selection_by_batch_size():
    ranges = [
        {"INPUT0": ((1, 16), (4, 16))},
        {"INPUT0": ((5, 16), (32, 16))},
    ]
    assert select_profile(ranges, {"INPUT0": (3, 16)}) == 0
    assert select_profile(ranges, {"INPUT0": (4, 16)}) == 0
    assert select_profile(ranges, {"INPUT0": (5, 16)}) == 1
    with pytest.raises(ValueError, match=r"no optimization profile .* INPUT0 \[33, 16\]"):
        select_profile(ranges, {"INPUT0": (33, 16)})
    with pytest.raises(ValueError):
        select_profile(ranges, {"INPUT0": (3, 8)})


def test_profile_selection_ignores_static_inputs():
    assert select_profile([{"A": ((1,), (8,))}], {"A": (2,), "STATIC": (3, 3)}) == 0


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the error for a missing tensorrt package; it is installed here")
def test_missing_tensorrt_is_a_clear_load_error(tmp_path):
    info = InstanceInfo("plan", 1, str(tmp_path), str(tmp_path / "1"), "plan_0_0", kind="GPU")
    backend = create(config(), model_view(config()), info)
    with pytest.raises(RuntimeError, match=r"needs the 'tensorrt' Python package, which is not installed"):
        backend.load()


def test_bad_config_fails_before_the_library_is_needed(tmp_path):
    info = InstanceInfo("plan", 1, str(tmp_path), str(tmp_path / "1"), "plan_0_0", kind="GPU")
    bad = config(input=[{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [1]}])
    backend = create(bad, model_view(bad), info)
    with pytest.raises(ValueError, match="unsupported datatype TYPE_STRING"):
        backend.load()
