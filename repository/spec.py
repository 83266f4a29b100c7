"""A model as the repository offers it: loadable, or with the reason it is not."""
from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2


@dataclass
class ModelSpec:
    """A model ready to load (`config` set, `error` empty) or the reason it is unavailable."""

    name: str
    path: str
    config: model_config_pb2.ModelConfig | None
    versions: list[int]
    error: str = ""
    unpolled: bool = False      # the error is one Triton finds while polling (errors.UnpolledError)
    advice: list[str] = field(default_factory=list)
