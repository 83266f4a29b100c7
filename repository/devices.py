"""How many GPUs this host can use, found without importing any CUDA library.

Instance-group normalization needs the answer (KIND_AUTO means GPU only when one
exists), and the repository package must stay importable on CPU-only machines.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess


@functools.cache
def gpu_count() -> int:
    """GPUs listed by `nvidia-smi -L`, limited by CUDA_VISIBLE_DEVICES; 0 when unavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip()]))
