"""glibc's malloc set up for a process that allocates multi-MiB buffers per request in code it
does not control: grpcio's message buffers and the bytes objects it makes of them (the gRPC
frontend), a decoded BYTES tensor and whatever arrays a model makes (a worker), a body that is
not taken straight into the arena (the HTTP frontend).

By default glibc serves an allocation above its mmap threshold with a fresh mapping (the
threshold starts at 128 KiB and rises only as such blocks are freed), and hands freed memory at
the top of a heap back to the kernel once more than the trim threshold is free there: a process
that allocates and frees several MiB per request then has the kernel map and zero-fill those
pages again on every request, which costs it more than copying the bytes. Fixed thresholds keep
the pages in the process for the next request. Thresholds given in the environment
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) are left as they are.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20       # glibc's largest (64-bit): larger messages still get mappings of their own
TRIM_THRESHOLD = 128 << 20      # free heap memory a frontend keeps for the next requests
WORKER_TRIM_THRESHOLD = 32 << 20    # a worker's: one of many processes, each keeping this much at most


def keep_large_allocations(trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Fix the thresholds (up to `trim_threshold` of free heap stays in the process); False
    where the environment sets them or the C library has no mallopt that takes them."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
