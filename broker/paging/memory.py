"""A worker process's real memory: its proportional set size (PSS), from /proc/<pid>/smaps_rollup.

PSS counts a process's private pages whole and divides each shared page among the processes that
map it, so the PSS of workers forked from one warm template adds up to what they really take
together, which file sizes or RSS do not say. Read on the job pool, never on the broker's loop.
"""
from __future__ import annotations

from collections.abc import Iterable


def pss_bytes(pid: int) -> int | None:
    """The process's PSS in bytes; None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def models_pss(pids: dict[str, Iterable[int]]) -> dict[str, int]:
    """Each model's workers' PSS summed, for the models whose workers could all be read."""
    out: dict[str, int] = {}
    for name, group in pids.items():
        total = 0
        for pid in group:
            size = pss_bytes(pid)
            if size is None:
                break
            total += size
        else:
            out[name] = total
    return out
