"""Socket addresses inside one server's private run directory."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Addresses:
    run_dir: str

    @property
    def frontends(self) -> str:
        return "ipc://" + os.path.join(self.run_dir, "frontends.sock")

    @property
    def workers(self) -> str:
        return "ipc://" + os.path.join(self.run_dir, "workers.sock")
