"""Entry point of the broker process: `python -m tritond.broker.main <options-json>`."""
from __future__ import annotations

import os
import shutil
import signal
import sys

from tritond.process import become_subreaper, die_with_parent, setup_logging
from tritond.shm.naming import PREFIX, sweep
from tritond.wire import options as wire_options

from tritond.broker.supervision.pool import WorkerProcesses
from tritond.broker.server import Broker
from tritond.broker.sockets import BrokerSockets
from tritond.broker.supervision.templates import Templates


def main(argv: list[str]) -> int:
    opts = wire_options.decode(argv[1])
    die_with_parent(opts.supervisor_pid, signal.SIGTERM)     # another broker's: the first broker's pid
    setup_logging(opts.log_verbose, "broker", opts.log)
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_w, False)
    signal.set_wakeup_fd(sig_w)
    signal.signal(signal.SIGTERM, lambda *_: None)     # the wakeup fd carries it to the loop
    signal.signal(signal.SIGHUP, lambda *_: None)      # so does a SIGHUP (rescan in poll mode)
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # the supervisor turns ^C into a drain
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)      # log reopening comes by message
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})   # started blocked (supervisor/children.py)
    become_subreaper()
    sockets = BrokerSockets(opts.run_dir, opts.shard)
    pool = WorkerProcesses(Templates(enabled=opts.worker_templates))
    try:
        code = Broker(opts, sockets, pool).run(sig_r)
    finally:
        pool.close()
        sockets.close()
    if os.getppid() != opts.supervisor_pid and not opts.shard:
        # The supervisor was killed and cannot clean up: the last process of the server does.
        sweep(f"{PREFIX}{opts.server_id}.")
        shutil.rmtree(opts.run_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
