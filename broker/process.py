"""Process hygiene shared by every tritond process: parent-death signal and logging."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to signal us when our parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != expected_parent:
        os._exit(1)


def setup_logging(verbose: int, role: str) -> None:
    level = logging.DEBUG if verbose > 0 else logging.INFO
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname).1s {role}[{os.getpid()}] %(message)s",
        datefmt="%H:%M:%S",
    )
