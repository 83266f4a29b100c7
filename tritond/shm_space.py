"""Is /dev/shm large enough for this server's arenas?

Every frontend and every worker maps its own arena of segments of at least
`DEFAULT_SEGMENT_BYTES` (32 MiB) there, and a tmpfs that runs out kills the writer with
SIGBUS in the middle of a request. Containers get 64 MiB by default, which is too small
for even one frontend of each protocol and one worker, so the supervisor says so at startup.
"""
from __future__ import annotations

import os

from tritond.shm.arena import DEFAULT_SEGMENT_BYTES
from tritond.shm.naming import SHM_DIR
from tritond.wire.schema import INLINE_MAX

MIB = 1 << 20


def shm_needed(frontends: int, workers: int) -> int:
    """Bytes of /dev/shm the arenas need at their smallest (one segment per process)."""
    return (frontends + workers) * DEFAULT_SEGMENT_BYTES


def shm_shortfall(frontends: int, workers: int, path: str = SHM_DIR) -> str:
    """Why /dev/shm at `path` is too small for this many processes, or '' when it is not."""
    need = shm_needed(frontends, workers)
    try:
        st = os.statvfs(path)
    except OSError as e:
        return f"cannot read the size of {path}: {e.strerror}; tensors travel through it"
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    if free >= need:
        return ""
    what = f"{path} is {size // MIB} MiB" + (f" with {free // MIB} MiB free" if free < size else "")
    return (f"{what}, less than the {need // MIB} MiB the shared-memory arenas of {frontends} frontend and "
            f"{workers} worker processes need ({DEFAULT_SEGMENT_BYTES // MIB} MiB each at least): requests "
            f"with tensors over {INLINE_MAX // 1024} KiB will fail when it fills up. Give the server more: "
            f"`--shm-size=1g` for podman/docker, an emptyDir with `medium: Memory` mounted at /dev/shm "
            f"on Kubernetes (size: 32 MiB per process plus the tensors in flight)")
