"""Each process's memory on the GPUs, as NVML reports it (the per-process `usedGpuMemory` that
nvidia-smi lists): what a model's workers hold on a device, counted against that device's
--model-gpu-memory-budget. pynvml is imported only when a GPU budget is set, so a host without
GPUs never loads it. Read on the job pool, never on the broker's loop.

GPU ids are CUDA's, as instance groups name them: with CUDA_VISIBLE_DEVICES set, GPU i is the
i-th device it lists (an index or a UUID).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def _nvml() -> Any:
    import pynvml
    pynvml.nvmlInit()
    return pynvml


def _handle(nvml: Any, gpu: int) -> Any:
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return nvml.nvmlDeviceGetHandleByIndex(gpu)
    device = visible[gpu]
    if device.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(device))
    return nvml.nvmlDeviceGetHandleByUUID(device)


def device_memory_unreadable(gpus: Iterable[int]) -> str:
    """'' when NVML lists the processes on each of `gpus`; else why it cannot."""
    try:
        nvml = _nvml()
        for gpu in gpus:
            nvml.nvmlDeviceGetComputeRunningProcesses(_handle(nvml, gpu))
    except ImportError:
        return "the pynvml module is not installed (pip install nvidia-ml-py)"
    except Exception as e:      # noqa: BLE001 -- NVML's own errors (no driver, no permission) are reported as they are
        return f"{type(e).__name__}: {e}"
    return ""


class DeviceMemory:
    """The device memory of every process on the budgeted GPUs."""

    def __init__(self, gpus: Iterable[int]) -> None:
        self.gpus = sorted(gpus)
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}

    def read(self) -> dict[int, dict[int, int]]:
        """pid -> {GPU id: bytes} (a process the driver reports no figure for counts 0)."""
        if self._nvml is None:
            self._nvml = _nvml()
            self._handles = {gpu: _handle(self._nvml, gpu) for gpu in self.gpus}
        out: dict[int, dict[int, int]] = {}
        for gpu, handle in self._handles.items():
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                on = out.setdefault(int(proc.pid), {})
                on[gpu] = on.get(gpu, 0) + int(proc.usedGpuMemory or 0)
        return out


def processes_on(memory: dict[int, dict[int, int]], pids: Iterable[int]) -> dict[int, int]:
    """What the processes `pids` hold on each GPU together."""
    out: dict[int, int] = {}
    for pid in pids:
        for gpu, size in memory.get(pid, {}).items():
            out[gpu] = out.get(gpu, 0) + size
    return out
