"""Which broker schedules which model when the server runs several (--broker-shards).

Models are split in groups that never cross a broker: an ensemble with every model it
composes (transitively, and joined with any other ensemble sharing one of them), every other
model alone. A group goes to the broker its first name (in sort order) hashes to, with a
hash every process computes alike (crc32, not Python's salted hash), so a model alone lands
where `shard_of` says without reading any configuration.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping


def shard_of(name: str, shards: int) -> int:
    """The broker of a model that forms a group alone."""
    return zlib.crc32(name.encode()) % shards if shards > 1 else 0


def partition(steps: Mapping[str, Iterable[str]], shards: int) -> dict[str, int]:
    """`steps`: every model name mapped to the models it composes (empty for a non-ensemble).
    Returns each name, and each composed name, mapped to its broker."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name, composed in steps.items():
        top = root(name)
        for other in composed:
            low, high = sorted((top, root(other)))
            parent[high] = low
            top = low
    return {name: shard_of(root(name), shards) for name in list(parent)}
