"""What a GPU worker checks in its environment before CUDA starts.

The broker sets CUDA_VISIBLE_DEVICES (the instance's GPU, seen here as device 0) and, under
`tritond start --mps`, the MPS pipe/log directories and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
(from the model's `mps_active_thread_percentage` parameter or the server-wide option). CUDA
reads them once, at context creation, and ignores a bad percentage silently, so a GPU
backend calls `check_mps_share` before importing its framework.
"""
from __future__ import annotations

import os

PERCENTAGE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def check_mps_share(environ: dict[str, str] | None = None) -> int | None:
    """The SM share this worker runs with (None: the whole GPU); ValueError when malformed."""
    value = (os.environ if environ is None else environ).get(PERCENTAGE_VAR)
    if value is None:
        return None
    text = value.strip()
    if not (text.isdigit() and 1 <= int(text) <= 100):
        raise ValueError(f"parameter mps_active_thread_percentage ({PERCENTAGE_VAR}) must be an integer "
                         f"from 1 to 100, got '{value}'")
    return int(text)
