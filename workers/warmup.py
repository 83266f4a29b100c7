"""Running a model's warmup samples in its worker, before the worker tells the broker it is up.

So every instance, a restarted one included, is warm before it receives traffic, and nothing
of the warmup reaches the broker's statistics (as in Triton). A sample that raises or answers
any request with an error fails the load with the sample's name in the reason.
"""
from __future__ import annotations

import logging
import time

from tritond.repository.warmup import WarmupError, warmup_samples

from .backends.base import Backend, WorkerRequest

log = logging.getLogger("tritond.worker")


def warm_up(backend: Backend, config: dict, model_dir: str, instance: str) -> None:
    """Run every sample; raises WarmupError."""
    samples = warmup_samples(config, model_dir)
    for sample in samples:
        t0 = time.monotonic()
        requests = [WorkerRequest(dict(sample.inputs), [], f"warmup:{sample.name}") for _ in range(sample.batch_size)]
        for _ in range(sample.count):
            try:
                responses = backend.execute(requests)
            except MemoryError:
                raise
            except Exception as e:
                raise WarmupError(f"failed to run warmup sample '{sample.name}': {e or type(e).__name__}") from None
            errors = [r.error.message for r in responses if r.error is not None]
            if errors:
                raise WarmupError(f"failed to run warmup sample '{sample.name}': " + "; ".join(errors))
        log.info("instance '%s' ran warmup sample '%s' (batch %d, %d time(s)) in %.3f s",
                 instance, sample.name, sample.batch_size, sample.count, time.monotonic() - t0)
