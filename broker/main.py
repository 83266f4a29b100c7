"""Entry point of the broker process: `python -m tritond.broker.main <options-json>`."""
from __future__ import annotations

import json
import sys

from .process import die_with_parent, setup_logging
from .server import Broker


def main(argv: list[str]) -> int:
    opts = json.loads(argv[1])
    die_with_parent(opts["supervisor_pid"], 15)
    setup_logging(int(opts.get("log_verbose", 0)), "broker")
    return Broker(opts).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
