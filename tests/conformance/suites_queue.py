"""L0_model_queue: the dynamic batcher's queue policies (max queue size, timeout actions,
timeout override, priority levels) through custom_zero_1_float32 (the identity backend,
built into tritond) and an ensemble over it. One server per case, as test.sh does.
"""
from __future__ import annotations

from pathlib import Path

from suites_http import _append, _copytree, _fresh, _sed

MAX_UINT64 = 18446744073709551615
MAX_UINT32_PLUS_1 = 4294967296

# test case -> the dynamic_batching block test.sh appends (after `dynamic_batching { `)
BATCHING = {
    "test_max_queue_size": (
        "preferred_batch_size: [ 4, 8 ]\ndefault_queue_policy {\nmax_queue_size: 8\n}\n}\n"
        'parameters [\n{ key: "execute_delay_ms"; value: { string_value: "5000" }}\n]'),
    "test_policy_delay": (
        "preferred_batch_size: [ 4, 8 ]\nmax_queue_delay_microseconds: 10000000\n"
        "default_queue_policy {\ntimeout_action: DELAY\ndefault_timeout_microseconds: 100000\n}\n}"),
    "test_policy_reject": (
        "preferred_batch_size: [ 4, 8 ]\nmax_queue_delay_microseconds: 10000000\n"
        "default_queue_policy {\ndefault_timeout_microseconds: 100000\n}\n}"),
    "test_timeout_override": (
        "preferred_batch_size: [ 4, 8 ]\nmax_queue_delay_microseconds: 10000000\n"
        "default_queue_policy {\nallow_timeout_override: true\ndefault_timeout_microseconds: 1000000\n}\n}"),
    "test_priority_levels": (
        "preferred_batch_size: [ 4, 8 ]\nmax_queue_delay_microseconds: 10000000\n"
        "priority_levels: 2\ndefault_priority_level: 2\n}"),
    "test_max_priority_levels": (
        "preferred_batch_size: [ 4, 8 ]\nmax_queue_delay_microseconds: 10000000\n"
        f"priority_levels: {MAX_UINT64}\ndefault_priority_level: {MAX_UINT32_PLUS_1}\n}}"),
    "test_priority_with_policy": (
        "preferred_batch_size: [ 4, 8, 32 ]\nmax_queue_delay_microseconds: 10000000\n"
        "priority_levels: 2\ndefault_priority_level: 2\n"
        "default_queue_policy {\ntimeout_action: DELAY\nallow_timeout_override: true\n"
        "default_timeout_microseconds: 11000000\n}\n"
        "priority_queue_policy {\nkey: 2\nvalue: {\ntimeout_action: REJECT\nallow_timeout_override: true\n"
        "default_timeout_microseconds: 11000000\n}\n}\n}"),
}


def _models(qa, d: Path, case: str) -> Path:
    custom = d / "custom_zero_1_float32"
    _copytree(qa.qa / "custom_models" / "custom_zero_1_float32", custom)
    (custom / "1").mkdir(exist_ok=True)
    (d / "ensemble_zero_1_float32" / "1").mkdir(exist_ok=True)
    cfg = custom / "config.pbtxt"
    _sed(cfg, r"dims:.*\[.*\]", "dims: [ -1 ]")
    _sed(cfg, r"max_batch_size:.*", "max_batch_size: 32")
    _append(cfg, "instance_group [ { kind: KIND_CPU count: 1 }]")
    models = _fresh(d / "models")
    _copytree(d / "ensemble_zero_1_float32", models / "ensemble_zero_1_float32")
    _copytree(custom, models / "custom_zero_1_float32")
    _append(models / "custom_zero_1_float32" / "config.pbtxt", "dynamic_batching { \n" + BATCHING[case])
    return models


def l0_model_queue(qa) -> None:
    d = qa.qa / "L0_model_queue"
    for case in BATCHING:
        models = _models(qa, d, case)
        s = qa.start(d, f"--model-repository={models}", f"{case}.server.log")
        qa.unittest(d, "model_queue_test.py", [f"ModelQueueTest.{case}"], server=s)
        if s:
            s.stop()
