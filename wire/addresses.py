"""Socket addresses inside one server's private run directory."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Addresses:
    run_dir: str
    shard: int = 0          # which broker (--broker-shards): 0 keeps the plain names

    def _path(self, name: str) -> str:
        suffix = f".{self.shard}" if self.shard else ""
        return "ipc://" + os.path.join(self.run_dir, f"{name}{suffix}.sock")

    @property
    def frontends(self) -> str:
        return self._path("frontends")

    @property
    def workers(self) -> str:
        return self._path("workers")
