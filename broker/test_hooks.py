"""Triton's test-only environment hooks, which its qa suites set to make batching deterministic.
Neither is meant for production; each is logged when set.

- TRITONSERVER_DELAY_SCHEDULER=<n>: a model's scheduler forms no batch until <n> requests are
  queued (once; it then batches as configured), so a test can queue requests and know how the
  batcher will group them.
- TRITONSERVER_BACKLOG_DELAY_SCHEDULER=<n>: with the first, the sequence batcher also holds
  until <n> requests of sequences without a slot wait in its backlog.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tritond.broker")

DELAY_SCHEDULER = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_SCHEDULER = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


def _count(name: str, model: str) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return 0
    try:
        n = max(int(raw.strip()), 0)
    except ValueError:          # as Triton's atoi: not a number holds nothing
        n = 0
    log.info("%s=%s (test only): model '%s' forms no batch until %d requests are queued", name, raw, model, n)
    return n


def delay_scheduler(model: str) -> int:
    """Requests a model's scheduler waits for before its first batch (0: none)."""
    return _count(DELAY_SCHEDULER, model)


def backlog_delay_scheduler(model: str) -> int:
    """Backlogged requests the sequence batcher waits for (0: none)."""
    return _count(BACKLOG_DELAY_SCHEDULER, model)
