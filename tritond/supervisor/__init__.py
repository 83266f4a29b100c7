"""The process the user started: starts the broker and the frontends, restarts them when
they die, turns SIGTERM/SIGINT into a graceful drain, and leaves nothing behind.

core.py is the loop; each module beside it is one part of it (the child-process table, the
broker link, the clock, signals, startup, restarts, stopping, the hang watchdog, the exit
codes)."""
from .core import Supervisor
from .exit_codes import ExitCode
from .startup import Interrupted, StartupError

__all__ = ["ExitCode", "Interrupted", "StartupError", "Supervisor"]
