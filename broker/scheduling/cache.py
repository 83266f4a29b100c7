"""The response cache (`--cache-config local,size=<bytes>`, model `response_cache {enable: true}`).

A hit is answered here, in the broker, without any worker: one frontend->broker round trip.
Entries live in a shared-memory arena the broker allocates and owns (one segment of the
configured size); a hit's outputs go back by descriptor under a lease the frontend releases,
or inline when they are small (as workers send small outputs), which saves the release.
Eviction is least recently used, by bytes; an entry still leased when evicted is freed at its
last release. An entry counts what Triton's serialized entries hold: each output's bytes and what
describes them (name, datatype, shape, and their lengths), so a size holds what it holds there.

The key is Triton's (model name, version, and every input's name, datatype, shape and bytes;
not the request id nor the requested outputs). The frontend that already holds a request's
bytes hashes them (`Infer.cache_key`), and the broker adds the model and the version it
resolved. Keys from workers (BLS calls) are ignored, since a model's code could name another
request's entry; such calls execute. On a miss the request asks for every output, so that the
entry serves any later choice of outputs (frontends return only those requested), and the
outputs are copied into the arena when the answer passes through.

Only successful responses of cacheable models are stored: not decoupled, not sequence
models (their configs are refused), and an ensemble only when every model it composes
supports the cache (those need not enable it). The request an ensemble makes for a step whose
model enables the cache is looked up too, as in Triton: the broker hashes that request's
inputs (`step_lookup`; it holds them), the only time it reads request tensors. Entries belong
to the model version object they were made for, so a reload (a new version object) or an
unload invalidates them.
"""
from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass

from tritond.shm.arena import Arena
from tritond.wire.cache_key import inputs_digest
from tritond.shm.mapping import MappingError, SegmentMaps
from tritond.wire.replies import CacheUsage
from tritond.wire.schema import INLINE_BUDGET, INLINE_MAX, Block, Infer, InferReply, Inline, TensorDesc

from tritond.broker.clock import Clock
from tritond.broker.ensembles.plan import EnsembleVersion
from tritond.broker.tables.inflight import ReplyTo
from tritond.broker.tables.model_version import ModelVersion
from tritond.broker.tables.registry import ModelRegistry

log = logging.getLogger("tritond.broker")

OWNER = b"cache"            # the identity a hit's leases are released to
ARENA_OWNER = "b"           # segments tritond.<server>.b.*: the broker's


def entry_bytes(outputs: list[TensorDesc], sources: list[memoryview]) -> int:
    """The bytes an entry takes from the cache's size: every output's tensor bytes, name,
    datatype and dimensions, with a length word for each of the three and each dimension."""
    return sum(len(src) + len(d.name) + len(d.datatype) + 8 * (len(d.shape) + 3)
               for d, src in zip(outputs, sources))


@dataclass(eq=False)
class Entry:
    mv: ModelVersion
    outputs: list[tuple[str, str, list[int], str, int, int]]   # name, datatype, shape, seg, offset, nbytes
    nbytes: int
    inline: bool                    # small enough to answer inline
    leases: int = 0
    evicted: bool = False


class ResponseCache:
    def __init__(self, size: int, server_id: str, registry: ModelRegistry, clock: Clock) -> None:
        self.size = size
        self.registry = registry
        self.clock = clock
        self.arena = Arena(server_id, ARENA_OWNER, segment_bytes=max(size, 1)) if size > 0 else None
        self.maps = SegmentMaps()          # workers' output segments, read on insertion
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.leased: dict[int, Entry] = {}
        self.lease_ids = itertools.count(1)
        self.used = 0
        self.evictions = 0
        self.insertions = 0
        self.lookups = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.arena is not None

    # ---------------------------------------------------------------- eligibility

    def cacheable(self, mv: ModelVersion) -> bool:
        """The model enables the cache and supports it (an ensemble: so do what it composes)."""
        if self.arena is None or mv.config is None or not (mv.config.get("response_cache") or {}).get("enable"):
            return False
        return self.supports(mv, frozenset())

    def supports(self, mv: ModelVersion, seen: frozenset) -> bool:
        """Not decoupled, not a sequence model, and (an ensemble) composing only such models,
        which need not enable the cache themselves (as in Triton)."""
        config = mv.config or {}
        if mv.view.decoupled or config.get("sequence_batching") is not None:
            return False
        if not isinstance(mv, EnsembleVersion):
            return True
        if id(mv) in seen:
            return False
        for step in mv.plan.steps:
            _, _, sub = mv.composing(step)
            if sub is None or not self.supports(sub, seen | {id(mv)}):
                return False
        return True

    def mark(self) -> None:
        """Say in each model view whether its requests are cacheable, so frontends hash inputs
        only for those; drop what belongs to versions that were replaced or unloaded."""
        live = set()
        for mv in self.registry.versions():
            mv.view.response_cache = self.cacheable(mv)
            if not mv.unloaded:
                live.add(id(mv))
        stale = [k for k, e in self.entries.items() if id(e.mv) not in live or e.mv.unloaded]
        for k in stale:
            self._evict(self.entries.pop(k), count=False)

    # ---------------------------------------------------------------- requests

    def lookup(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> ReplyTo | None:
        """Answer a hit now (None), or return the reply route that stores the answer of a miss."""
        if not mv.view.response_cache:
            return reply
        start = self.clock.now_ns()
        key = (mv.name, mv.version, msg.cache_key)
        self.lookups += 1
        entry = self.entries.get(key)
        if entry is not None and entry.mv is not mv:
            self._evict(self.entries.pop(key), count=False)
            entry = None
        if entry is None:
            msg.outputs = []        # compute every output: the entry serves any later choice
            return self._filling(reply, key, mv, self.clock.now_ns() - start)
        self.entries.move_to_end(key)
        self.hits += 1
        outputs, lease = self._outputs(entry)
        end = self.clock.now_ns()
        mv.stats.record_cache_hit(end - start, 0, end - start)
        reply(InferReply(msg.rid, mv.version, outputs, None, OWNER if lease else b""))
        return None

    def step_lookup(self, reply: ReplyTo, msg: Infer, mv: ModelVersion) -> ReplyTo | None:
        """An ensemble step's request to a model that enables the cache, looked up as Triton
        does: keyed here from its inputs, which lie in memory the broker can map (the
        ensemble's inputs, earlier steps' outputs); in device memory it is not cacheable."""
        views = self._bytes_of(msg.inputs)
        if views is None:
            return reply
        msg.cache_key = inputs_digest((d.name, d.datatype, d.shape, v) for d, v in zip(msg.inputs, views))
        return self.lookup(reply, msg, mv)

    def _outputs(self, entry: Entry) -> tuple[list[TensorDesc], int]:
        view = self.arena.segments
        if entry.inline:
            return [TensorDesc(n, dt, shape, Inline(bytes(view[seg].view[off:off + nb])))
                    for n, dt, shape, seg, off, nb in entry.outputs], 0
        lease = next(self.lease_ids)
        self.leased[lease] = entry
        entry.leases += 1
        return [TensorDesc(n, dt, shape, Block(seg, off, nb, lease))
                for n, dt, shape, seg, off, nb in entry.outputs], lease

    def _filling(self, reply: ReplyTo, key: tuple, mv: ModelVersion, lookup_ns: int) -> ReplyTo:
        def store(r: InferReply) -> None:
            if r.error is None:
                t = self.clock.now_ns()
                self.insert(key, mv, r.outputs)
                mv.stats.record_cache_miss(lookup_ns + self.clock.now_ns() - t)
            reply(r)
        return store

    # ---------------------------------------------------------------- storing

    def _bytes_of(self, descs: list[TensorDesc]) -> list[memoryview] | None:
        """The bytes of tensors inline or in an arena the broker maps; None when one lies
        elsewhere (a client region, device memory) or its segment is gone."""
        views = []
        for d in descs:
            loc = d.loc
            if isinstance(loc, Inline):
                views.append(memoryview(loc.data))
            elif isinstance(loc, Block):
                try:
                    views.append(self.maps.view(loc.seg, loc.offset, loc.nbytes))
                except MappingError:
                    return None
            else:
                return None
        return views

    def insert(self, key: tuple, mv: ModelVersion, outputs: list[TensorDesc]) -> None:
        sources = self._bytes_of(outputs)
        if sources is None:
            return                  # a client region or device memory: not the cache's to copy
        total = entry_bytes(outputs, sources)
        if key in self.entries:
            return
        if total > self.size:
            self._not_inserted(key, f"{total} bytes exceed the cache size of {self.size} bytes")
            return
        while self.used + total > self.size:
            _, victim = self.entries.popitem(last=False)
            self._evict(victim)
        blocks = []
        for src in sources:
            block = self._alloc(len(src))
            if block is None:
                for seg, off in blocks:
                    self.arena.free(seg, off)
                self._not_inserted(key, f"no room for {total} bytes in a cache of {self.size} bytes")
                return
            block.view[:] = src
            blocks.append((block.seg, block.offset))
        inline = sum(len(s) for s in sources) <= INLINE_BUDGET and all(len(s) <= INLINE_MAX for s in sources)
        entry = Entry(mv, [(d.name, d.datatype, list(d.shape), seg, off, len(src))
                                for d, (seg, off), src in zip(outputs, blocks, sources)], total, inline)
        self.entries[key] = entry
        self.used += total
        self.insertions += 1

    @staticmethod
    def _not_inserted(key: tuple, why: str) -> None:
        """Said as tritonserver says it: the response is answered, but later requests will miss."""
        name, version, digest = key
        log.error("Failed to insert key [%s:%s:%s] into response cache: %s", name, version, digest.hex(), why)

    def _alloc(self, nbytes: int):
        """A block, evicting least recently used entries until one fits."""
        while True:
            block = self.arena.alloc_bounded(nbytes)
            if block is not None or not self.entries:
                return block
            _, victim = self.entries.popitem(last=False)
            self._evict(victim)

    def _evict(self, entry: Entry, count: bool = True) -> None:
        if entry.evicted:
            return
        entry.evicted = True
        self.used -= entry.nbytes
        if count:
            self.evictions += 1
        if entry.leases == 0:
            self._free(entry)

    def _free(self, entry: Entry) -> None:
        """Once per entry: when it is evicted and no hit holds it."""
        for _, _, _, seg, off, _ in entry.outputs:
            self.arena.free(seg, off)

    def release(self, leases: list[int]) -> None:
        """A frontend is done with a hit's outputs."""
        for lease in leases:
            entry = self.leased.pop(lease, None)
            if entry is None:
                continue
            entry.leases -= 1
            if entry.evicted and entry.leases == 0:
                self._free(entry)

    # ---------------------------------------------------------------- reporting

    def usage(self) -> CacheUsage:
        return CacheUsage(self.size, self.used, len(self.entries), self.evictions, self.insertions, self.lookups,
                          self.hits)

    def drop_mappings(self, prefix: str) -> None:
        self.maps.drop_prefix(prefix)

    def close(self) -> None:
        self.maps.close()
        if self.arena is not None:
            self.arena.close()


