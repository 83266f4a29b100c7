"""The configurations `tritond analyze` tries: which fields it changes, the values it tries
for each, and how a candidate is written into (and read back from) a model config."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace

ORT_THREADS = "intra_op_thread_count"


@dataclass(frozen=True)
class Candidate:
    """The fields a sweep varies; everything else stays as in the model's own config.

    `preferred` () means the batcher's default (Triton's: max_batch_size); `threads` 0 means
    the parameter is not set (the backend's default)."""

    instances: int
    max_batch_size: int
    dynamic: bool
    queue_delay_us: int = 0
    preferred: tuple[int, ...] = ()
    threads: int = 0

    def normalized(self) -> "Candidate":
        """Equal candidates compare equal: batcher fields only count when batching is on."""
        if not self.dynamic:
            return replace(self, queue_delay_us=0, preferred=())
        if self.preferred == (self.max_batch_size,):
            return replace(self, preferred=())
        return self

    def label(self) -> str:
        parts = [f"{self.instances} inst"]
        if self.max_batch_size > 0:
            parts.append(f"max batch {self.max_batch_size}")
            if self.dynamic:
                pref = f", pref {'/'.join(map(str, self.preferred))}" if self.preferred else ""
                parts.append(f"dyn {self.queue_delay_us}us{pref}")
            else:
                parts.append("no dyn")
        if self.threads:
            parts.append(f"{self.threads} thr")
        return " · ".join(parts)

    def fields(self) -> dict:
        return {"instances": self.instances, "max_batch_size": self.max_batch_size,
                "dynamic_batching": self.dynamic, "max_queue_delay_us": self.queue_delay_us if self.dynamic else "",
                "preferred_batch_size": "/".join(map(str, self.preferred)) if self.dynamic else "",
                "intra_op_thread_count": self.threads or ""}


def from_config(config: dict) -> Candidate:
    """The candidate a (server-rendered or file) config dict describes."""
    groups = config.get("instance_group") or []
    instances = int(groups[0].get("count", 1)) if groups else 1
    mbs = int(config.get("max_batch_size", 0))
    dyn = config.get("dynamic_batching")
    threads = ((config.get("parameters") or {}).get(ORT_THREADS) or {}).get("string_value", "")
    return Candidate(
        instances=instances, max_batch_size=mbs, dynamic=dyn is not None,
        queue_delay_us=int((dyn or {}).get("max_queue_delay_microseconds", 0)),
        preferred=tuple(int(p) for p in (dyn or {}).get("preferred_batch_size", [])),
        threads=int(threads) if str(threads).isdigit() else 0,
    ).normalized()


def apply(config: dict, c: Candidate, default_kind: str = "KIND_CPU") -> dict:
    """`config` with the candidate's fields set; works on a full (server) or minimal (file) config."""
    out = copy.deepcopy(config)
    groups = out.get("instance_group") or [{"kind": default_kind}]
    for group in groups:
        group["count"] = c.instances
    out["instance_group"] = groups
    if c.max_batch_size > 0:
        out["max_batch_size"] = c.max_batch_size
    if c.dynamic:
        dyn = out.get("dynamic_batching") or {}
        dyn["max_queue_delay_microseconds"] = c.queue_delay_us
        dyn["preferred_batch_size"] = list(c.preferred)
        out["dynamic_batching"] = dyn
    else:
        out.pop("dynamic_batching", None)
    params = out.get("parameters") or {}
    if c.threads:
        params[ORT_THREADS] = {"string_value": str(c.threads)}
    else:
        params.pop(ORT_THREADS, None)
    out["parameters"] = params
    return out


def mismatches(applied: dict, c: Candidate) -> list[str]:
    """What the server's config shows differently from the candidate (empty: applied as asked)."""
    got, want = from_config(applied), c.normalized()
    return [f"{name}: asked {w}, server has {g}" for name, w, g in
            ((k, want.fields()[k], got.fields()[k]) for k in want.fields()) if w != g]


def _powers_of_two(low: int, high: int) -> list[int]:
    out, v = [], 1
    while v <= high:
        if v >= low:
            out.append(v)
        v *= 2
    return out


@dataclass
class Space:
    """The values tried per dimension."""

    instances: list[int]
    max_batch_sizes: list[int]
    dynamic: list[bool]
    queue_delays_us: list[int]
    preferred: list[tuple[int, ...]]
    threads: list[int]
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])

    def candidates_for(self, dim: str, current: Candidate) -> list[Candidate]:
        """`current` varied along one dimension, in the order the values were given; combinations
        that mean nothing (batcher fields without the batcher, preferred above max) are left out."""
        if dim == "instances":
            out = [replace(current, instances=v) for v in self.instances]
        elif dim == "dynamic":
            out = [replace(current, dynamic=False)] if False in self.dynamic else []
            if True in self.dynamic:
                out += [replace(current, dynamic=True, queue_delay_us=d) for d in self.queue_delays_us]
        elif dim == "max_batch_size":   # without the batcher, a request's own batch is all there is
            out = [replace(current, max_batch_size=v, preferred=tuple(p for p in current.preferred if p <= v))
                   for v in self.max_batch_sizes] if current.dynamic else []
        elif dim == "preferred":
            out = [replace(current, preferred=p) for p in self.preferred
                   if all(x <= current.max_batch_size for x in p)] if current.dynamic else []
        elif dim == "threads":
            out = [replace(current, threads=v) for v in self.threads]
        else:
            raise ValueError(dim)
        seen, unique = set(), []
        for c in (c.normalized() for c in out):
            if c not in seen:
                seen.add(c)
                unique.append(c)
        return unique

    def dimensions(self, base: Candidate) -> list[str]:
        """The dimensions whose values are not just the base's own (those the search walks);
        batcher dimensions count when the batcher is on in the base or can be turned on."""
        starts = [base.normalized()]
        if True in self.dynamic and not base.dynamic and base.max_batch_size > 0:
            starts.append(replace(base, dynamic=True, queue_delay_us=self.queue_delays_us[0]).normalized())
        return [dim for dim in ("instances", "dynamic", "max_batch_size", "preferred", "threads")
                if any(c != s for s in starts for c in self.candidates_for(dim, s))]

    def all_candidates(self) -> list[Candidate]:
        """The full grid (brute force), without meaningless or repeated combinations (batcher
        fields without the batcher; without it, only the largest max_batch_size)."""
        out, seen = [], set()
        for inst in self.instances:
            for mbs in self.max_batch_sizes:
                for thr in self.threads:
                    variants = []
                    if False in self.dynamic and mbs == max(self.max_batch_sizes):
                        variants.append(Candidate(inst, mbs, False, threads=thr))
                    if True in self.dynamic and mbs > 0:
                        variants += [Candidate(inst, mbs, True, d, p, thr)
                                     for d in self.queue_delays_us for p in self.preferred
                                     if all(x <= mbs for x in p)]
                    for c in (v.normalized() for v in variants):
                        if c not in seen:
                            seen.add(c)
                            out.append(c)
        return out


def default_space(base: Candidate, backend: str, cpus: int | None = None) -> Space:
    """Values to try when the command line names none: instances 1..min(4, CPUs); for a
    batching model the batcher off and on with 100/500/2000 us delay, max batch sizes from 8
    up to the model's own, preferred sizes none/4/8/16; ORT thread counts up to the CPUs."""
    cpus = cpus or os.cpu_count() or 1
    batching = base.max_batch_size > 0
    mbs = sorted(set(_powers_of_two(8, base.max_batch_size) + [base.max_batch_size])) if batching else [0]
    return Space(
        instances=list(range(1, max(min(4, cpus), base.instances) + 1)),
        max_batch_sizes=mbs,
        dynamic=[False, True] if batching else [False],
        queue_delays_us=sorted({100, 500, 2000} | ({base.queue_delay_us} if base.dynamic else set())) if batching else [0],
        preferred=[()] + [(p,) for p in (4, 8, 16) if p <= base.max_batch_size] if batching else [()],
        threads=_powers_of_two(1, cpus) if backend == "onnxruntime" else [base.threads],
    )
