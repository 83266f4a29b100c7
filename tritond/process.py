"""Process hygiene shared by every tritond process: parent-death signal, memory limit,
logging, and the exit code a worker uses when it runs out of memory."""
from __future__ import annotations

import ctypes
import os
import resource
import signal

import msgspec

from tritond import logs
from tritond.wire.schema import LogConfig

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# A worker that hits MemoryError exits with this code (ENOMEM), so the broker can say why.
EXIT_NO_MEMORY = 12
# A frontend the broker refused (another protocol version) exits with this code; the
# supervisor restarts it from the current code.
EXIT_REFUSED = 4


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to signal us when our parent dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != expected_parent:
        os._exit(1)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to us, not to init: workers forked from a
    template are the broker's children to watch and reap."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def limit_memory(nbytes: int) -> None:
    """Cap what this process may allocate (RLIMIT_DATA: heap and private mappings).

    RLIMIT_DATA rather than RLIMIT_AS, so that mapping shared-memory tensors and client
    regions, and address space reserved but never written, do not count against it.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        nbytes = min(nbytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (nbytes, hard))


def setup_logging(verbose: int, role: str, log: dict | LogConfig | None = None) -> None:
    """This process's log handler: the server's log settings (options "log"), or stderr at
    `verbose`."""
    if isinstance(log, dict):
        log = msgspec.convert(log, LogConfig)
    logs.setup(role, log or LogConfig(verbose=verbose))
