"""The request path and its schedulers: admission, one scheduling interface that the default,
dynamic and sequence schedulers implement, batches to workers, answers; and what sits on
the path (response cache, rate limiter, decoupled streams, BLS calls)."""
