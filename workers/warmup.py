"""Running a model's warmup samples in its worker, before the worker tells the broker it is up.

So every instance, a restarted one included, is warm before it receives traffic, and nothing
of the warmup reaches the broker's statistics (as in Triton). Each sample runs as a batch
through the worker's own execute path (inputs decoded, backend run, outputs written and
released), so the first client request finds that path warm too. A sample that fails any of
its requests fails the load with the sample's name in the reason.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tritond.repository.datatypes import array_to_bytes
from tritond.repository.warmup import WarmupError, warmup_samples
from tritond.wire.schema import BatchDone, Exec, ExecRequest, Inline, TensorDesc, lease_of

log = logging.getLogger("tritond.worker")

WARMUP_BID = -1


def warm_up(execute: Callable[[Exec], BatchDone], release: Callable[[int], None], config: dict,
            model_dir: str, instance: str) -> None:
    """Run every sample through `execute`; `release` frees an output lease. Raises WarmupError."""
    for sample in warmup_samples(config, model_dir):
        t0 = time.monotonic()
        inputs = [TensorDesc(name, dtype, list(a.shape), Inline(bytes(array_to_bytes(a, dtype))))
                  for name, (dtype, a) in sample.inputs.items()]
        msg = Exec(WARMUP_BID, [ExecRequest(inputs, [], f"warmup:{sample.name}") for _ in range(sample.batch_size)])
        for iteration in range(1, sample.count + 1):
            log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                      config.get("name", ""), instance, sample.name, iteration)
            done = execute(msg)
            for result in done.results:
                for desc in result.outputs:
                    lease = lease_of(desc)
                    if lease:
                        release(lease)
            errors = [r.error.message for r in done.results if r.error is not None]
            if errors:
                # Triton's words: each failed request's error, each followed by "; "
                raise WarmupError(f"failed to run warmup sample '{sample.name}': " + "".join(f"{e}; " for e in errors))
        log.info("instance '%s' ran warmup sample '%s' (batch %d, %d time(s)) in %.3f s",
                 instance, sample.name, sample.batch_size, sample.count, time.monotonic() - t0)
