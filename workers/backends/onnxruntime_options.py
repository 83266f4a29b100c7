"""The ONNX Runtime settings a config asks for, read as Triton's onnxruntime backend reads them:
`optimization.graph.level`, the `execution_mode`, `enable_mem_arena`, `enable_mem_pattern`,
`session.use_device_allocator_for_initializers` and `memory.enable_memory_arena_shrinkage`
parameters and the CPU execution accelerators, with its verbose log lines and its errors (a value
it cannot parse fails the load). Pure: the worker applies the result to its session."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritond.repository.parameters import config_parameter

# optimization.graph.level -> ONNX Runtime's GraphOptimizationLevel (anything else: ORT_ENABLE_ALL)
GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
USE_DEVICE_ALLOCATOR = "session.use_device_allocator_for_initializers"
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
OPENVINO = "openvino"


@dataclass(frozen=True)
class OrtSettings:
    graph_level: str = "ORT_ENABLE_ALL"
    parallel: bool = False                           # execution_mode 1
    session_entries: tuple[tuple[str, str], ...] = ()
    mem_arena: bool | None = None                    # None: ONNX Runtime's default
    mem_pattern: bool | None = None
    run_entries: tuple[tuple[str, str], ...] = ()    # set on every run's RunOptions
    cpu_accelerators: tuple[str, ...] = ()
    log_lines: tuple[str, ...] = ()                  # Triton's verbose lines for what is configured


def _bool(value: str) -> bool:
    low = value.lower()
    if low in ("true", "on", "1"):
        return True
    if low in ("false", "off", "0"):
        return False
    raise ValueError(f"failed to convert '{value}' to boolean value")


def _has(config: dict[str, Any], key: str) -> bool:
    return key in (config.get("parameters") or {})


def ort_settings(config: dict[str, Any], model: str) -> OrtSettings:
    """The settings of `config` (a config JSON dict); ValueError with Triton's words for a value
    its backend refuses."""
    graph = (config.get("optimization") or {}).get("graph") or {}
    level = GRAPH_LEVELS.get(int(graph.get("level", 0) or 0), "ORT_ENABLE_ALL")
    raw_mode = config_parameter(config, "execution_mode", "0") or "0"
    try:
        mode = int(raw_mode)
    except ValueError:
        raise ValueError(f"failed to convert '{raw_mode}' to integral number") from None
    if mode not in (0, 1):
        raise ValueError(f"Invalid configuration value provided. Expected values for  execution_mode are 0 or 1 "
                         f"but got {mode} .")
    logs: list[str] = []
    session: list[tuple[str, str]] = []
    if _has(config, USE_DEVICE_ALLOCATOR):
        value = config_parameter(config, USE_DEVICE_ALLOCATOR)
        session.append((USE_DEVICE_ALLOCATOR, value))
        logs.append(f"Configuring '{USE_DEVICE_ALLOCATOR}' to '{value}' for '{model}'")
    memory: dict[str, bool] = {}
    for key in ("enable_mem_arena", "enable_mem_pattern"):
        if _has(config, key):
            value = config_parameter(config, key)
            memory[key] = _bool(value)
            logs.append(f"Configuring {key} to {value}")
    run: list[tuple[str, str]] = []
    if _has(config, ARENA_SHRINKAGE):
        value = config_parameter(config, ARENA_SHRINKAGE)
        run.append((ARENA_SHRINKAGE, value))
        logs.append(f"Configuring {ARENA_SHRINKAGE} to {value}")
    accelerators = ((config.get("optimization") or {}).get("execution_accelerators") or {})
    cpu = tuple(str(a.get("name", "")) for a in accelerators.get("cpu_execution_accelerator") or [])
    for name in cpu:
        if name != OPENVINO:
            raise ValueError(f"unknown Execution Accelerator '{name}' is requested")
    return OrtSettings(level, mode == 1, tuple(session), memory.get("enable_mem_arena"),
                       memory.get("enable_mem_pattern"), tuple(run), cpu, tuple(logs))
