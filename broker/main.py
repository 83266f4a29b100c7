"""Entry point of the broker process: `python -m tritond.broker.main <options-json>`."""
from __future__ import annotations

import json
import os
import shutil
import sys

from tritond.shm.naming import PREFIX, sweep

from .process import die_with_parent, setup_logging
from .server import Broker


def main(argv: list[str]) -> int:
    opts = json.loads(argv[1])
    die_with_parent(opts["supervisor_pid"], 15)
    setup_logging(int(opts.get("log_verbose", 0)), "broker")
    code = Broker(opts).run()
    if os.getppid() != opts["supervisor_pid"]:
        # The supervisor was killed and cannot clean up: the last process of the server does.
        sweep(f"{PREFIX}{opts['server_id']}.")
        shutil.rmtree(opts["run_dir"], ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
