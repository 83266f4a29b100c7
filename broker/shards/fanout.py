"""The control operations of a server with several brokers, as the first broker answers them.

Frontends send every control operation to the first broker. One about a model goes to the
broker that schedules it; one about the whole server goes to every broker and the answers
merge (the repository index, statistics and metrics of all models, the shared-memory regions
any broker still holds; a drain that ends when every broker's has); what every broker must
know alike (client shared-memory regions, log
and trace settings) is applied here first, so that a refusal comes from one place, then
passed on and remembered for a broker that restarts.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tritond.repository.ensemble import ensemble_dependencies
from tritond.repository.layout import scan
from tritond.repository.partition import partition, shard_of
from tritond.repository.remote import RemoteError
from tritond.wire import replies as R
from tritond.wire import schema as S
from tritond.wire.errors import TritonError
from tritond.wire.options import ServerOptions

from tritond.broker.lifecycle.jobs import Jobs
from tritond.broker.shards.links import Answer, PeerLinks
from tritond.broker.shards.secondaries import Secondaries

log = logging.getLogger("tritond.broker")

Local = Callable[[S.ControlOp, Answer], None]
Merge = Callable[[list[Any]], Any]


class _Gather:
    """The answers of every broker to one operation; `done` gets them in broker order once all
    arrived (a TritonError in place of a broker's result when it failed)."""

    def __init__(self, count: int, done: Callable[[list[Any]], None]) -> None:
        self.results: list[Any] = [None] * count
        self.left = count
        self.done = done

    def answer_for(self, index: int) -> Answer:
        def answer(result: Any = None, error: TritonError | None = None) -> None:
            self.results[index] = error if error is not None else result
            self.left -= 1
            if self.left == 0:
                self.done(self.results)
        return answer


def _first(results: list[Any]) -> Any:
    """This broker's answer stands for all (the others' failures are logged)."""
    for k, r in enumerate(results[1:], 1):
        if isinstance(r, TritonError):
            log.warning("broker %d: %s", k, r.message)
    return results[0]


def _others(results: list[Any]) -> list[Any]:
    """Results of every broker that answered; a broker away while it restarts is left out."""
    if isinstance(results[0], TritonError):
        raise results[0]
    return [r for r in results if not isinstance(r, TritonError)]


def _index(results: list[Any]) -> R.IndexReply:
    return R.IndexReply(sorted((m for r in _others(results) for m in r.models), key=lambda m: m.name))


def _stats(results: list[Any]) -> R.StatsReply:
    return R.StatsReply([s for r in _others(results) for s in r.model_stats])


def _regions(results: list[Any]) -> R.ShmStatusReply | R.CudaStatusReply:
    """A region is listed while any broker still holds it (one unregistered while requests use
    it stays until they finish, in the broker that runs them)."""
    answered = [r for r in results if not isinstance(r, TritonError)]
    if not answered:
        raise results[0]
    seen: dict[str, Any] = {}
    for r in answered:
        for region in r.regions:
            seen.setdefault(region.name, region)
    return type(answered[0])(list(seen.values()))


class Fanout:
    def __init__(self, links: PeerLinks, secondaries: Secondaries, jobs: Jobs, local: Local,
                 own_names: Callable[[], list[str]], opts: ServerOptions) -> None:
        self.links = links
        self.others = sorted(links.links)
        self.secondaries = secondaries
        self.jobs = jobs
        self.local = local
        self.own_names = own_names
        self.opts = opts
        self._ops: dict[type, Callable[[Any, Answer], None]] = {
            S.RepositoryIndex: lambda op, a: self.everywhere(op, a, _index),
            S.LoadModel: self.load,
            S.UnloadModel: lambda op, a: self.to_owner(op.name, op, a),
            S.Statistics: self.stats,
            S.ModelMetrics: lambda op, a: self.everywhere(op, a, self._metrics),
            S.ShmRegister: lambda op, a: self.everywhere_kept(op, a, ("shm", op.name)),
            S.ShmUnregister: lambda op, a: self.everywhere_kept(op, a, ("shm", op.name)),
            S.CudaRegister: lambda op, a: self.everywhere_kept(op, a, ("cuda", op.name)),
            S.CudaUnregister: lambda op, a: self.everywhere_kept(op, a, ("cuda", op.name)),
            S.ShmStatus: lambda op, a: self.everywhere(op, a, _regions),
            S.CudaStatus: lambda op, a: self.everywhere(op, a, _regions),
            S.LogSettings: lambda op, a: self.everywhere_kept(op, a, ("log", repr(sorted(op.settings)))),
            S.TraceSettings: self.trace,
            S.ReopenLog: lambda op, a: self.everywhere(op, a, _first),
            S.Drain: lambda op, a: self.everywhere(op, a, self._drained),
            S.StopServer: lambda op, a: self.everywhere(op, a, _first),
        }

    def handle(self, op: S.ControlOp, answer: Answer) -> None:
        self._ops[type(op)](op, answer)

    # ---------------------------------------------------------------- routes

    def owner(self, name: str) -> int:
        return 0 if name in self.own_names() else (self.links.owner(name) or 0)

    def to_owner(self, name: str, op: S.ControlOp, answer: Answer) -> None:
        k = self.owner(name)
        if k == 0:
            self.local(op, answer)
        else:
            self.links.ask(k, op, answer)

    def everywhere(self, op: S.ControlOp, answer: Answer, merge: Merge) -> None:
        def done(results: list[Any]) -> None:
            try:
                merged = merge(results)
            except TritonError as e:
                answer(error=e)
                return
            if isinstance(merged, TritonError):
                answer(error=merged)
            else:
                answer(merged)
        gather = _Gather(1 + len(self.others), done)
        self.local(op, gather.answer_for(0))
        for k in self.others:
            self.links.ask(k, op, gather.answer_for(k))

    def everywhere_kept(self, op: S.ControlOp, answer: Answer, key: tuple[str, str]) -> None:
        """Applied here first (a refusal is answered from here alone), then everywhere else,
        and kept for a broker that restarts."""
        def here(result: Any = None, error: TritonError | None = None) -> None:
            if error is not None:
                answer(error=error)
                return
            self._keep(op, key)
            gather = _Gather(len(self.others), lambda results: answer(result))
            for k in self.others:
                self.links.ask(k, op, gather.answer_for(k - 1))
        self.local(op, here)

    def _keep(self, op: S.ControlOp, key: tuple[str, str]) -> None:
        kind, name = key
        if isinstance(op, (S.ShmUnregister, S.CudaUnregister)):
            if name:
                self.secondaries.remember(key, None)
            else:
                for k in [k for k in self.secondaries.replay if k[0] == kind]:
                    self.secondaries.remember(k, None)
        else:
            self.secondaries.remember(key, op)

    def load(self, op: S.LoadModel, answer: Answer) -> None:
        """The broker a load goes to is decided from the repository as it is now (a new
        ensemble may join models to another broker's group), read on the job pool."""
        def owner() -> int:
            if op.override_dir:
                return shard_of(op.name, self.opts.broker_shards)
            sources = scan(self.opts.model_repositories)
            config = self.opts.model_config_name
            owners = partition({n: ensemble_dependencies(s.path, config) or [] for n, s in sources.items()},
                               self.opts.broker_shards)
            return owners.get(op.name, shard_of(op.name, self.opts.broker_shards))

        def routed(fut: Future) -> None:
            try:
                k = fut.result()
            except (OSError, RemoteError):      # the repository cannot be read: the load says so
                k = 0
            if k == 0:
                self.local(op, answer)
            else:
                self.links.ask(k, op, answer)
        self.jobs.submit(owner, routed)

    def stats(self, op: S.Statistics, answer: Answer) -> None:
        if op.name:
            self.to_owner(op.name, op, answer)
        else:
            self.everywhere(op, answer, _stats)

    def trace(self, op: S.TraceSettings, answer: Answer) -> None:
        """A model's trace settings live with its broker; the server's, everywhere."""
        if op.model:
            self.to_owner(op.model, op, answer)
        else:
            self.everywhere_kept(op, answer, ("trace", repr(sorted(op.settings))))

    # ---------------------------------------------------------------- merges

    def _metrics(self, results: list[Any]) -> R.MetricsReply:
        replies = _others(results)
        own = replies[0]
        peers = {(p.role, p.pid) for r in replies for p in r.peers if p.role != "broker"}
        peers |= {("broker", pid) for pid in self.secondaries.pids()}
        caches = [r.cache for r in replies if r.cache is not None]
        cache = None
        if caches:
            cache = R.CacheUsage(*(sum(getattr(c, f) for c in caches) for f in R.CacheUsage.__struct_fields__))
        return R.MetricsReply([m for r in replies for m in r.models], own.broker_pid,
                              [R.Peer(role, pid) for role, pid in sorted(peers)],
                              sum(r.queued for r in replies), sum(r.inflight_batches for r in replies), cache,
                              custom=[f for r in replies for f in r.custom])

    @staticmethod
    def _drained(results: list[Any]) -> R.DrainReply:
        return R.DrainReply(all(isinstance(r, R.DrainReply) and r.drained for r in results))
