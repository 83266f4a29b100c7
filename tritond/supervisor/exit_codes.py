"""What the supervisor's exit status tells whoever restarts it (systemd, supervisord,
Kubernetes) and the scripts that wait on it."""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    CLEAN = 0            # stopped on request, nothing in flight was lost
    STARTUP_FAILED = 1   # a model failed with --exit-on-error, a port could not be bound, the broker would not start
    CANCELLED = 2        # in-flight requests had to be cancelled at the exit timeout
    GAVE_UP = 3          # the broker or a frontend kept dying, or the broker could not be restarted
