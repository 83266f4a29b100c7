"""Ensemble models: a DAG over other models' schedulers, run inside the broker."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import protocol as P
from .models import UNAVAILABLE, ModelVersion

if TYPE_CHECKING:
    from .server import Broker


class Ensembles:
    def __init__(self, broker: "Broker") -> None:
        self.b = broker

    def setup(self, mv: ModelVersion) -> None:
        self.b.set_state(mv, UNAVAILABLE, "ensemble models are not supported by this server yet")

    def run(self, src, msg: P.Infer, mv: ModelVersion) -> None:
        self.b.reject(src, msg, P.Err("UNSUPPORTED", "ensemble models are not supported by this server yet"))
