"""Triton's model/version lookup with its exact error texts, shared by the broker's registry
and the frontends' copy of the model table."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from .errors import Code, TritonError
from .schema import ModelState


class Versioned(Protocol):
    state: ModelState


V = TypeVar("V", bound=Versioned)


def resolve(name: str, version: int, versions: Mapping[int, V] | None, known: bool) -> V:
    """The version serving (name, version): `version` < 0 means the latest READY one.
    `versions` is None when the model is not loaded; `known` says whether the repository
    has a model of that name."""
    if versions is None:
        if known:
            raise TritonError(Code.NOT_FOUND, f"'{name}' is not found")
        raise TritonError(Code.INVALID_ARG, f"Request for unknown model: '{name}' is not found")
    if version >= 0:
        found = versions.get(version)
        if found is None:
            raise TritonError(Code.NOT_FOUND, f"'{name}' version {version} is not found")
        if found.state is not ModelState.READY:
            raise TritonError(Code.UNAVAILABLE, f"'{name}' version {version} is not at ready state")
        return found
    ready = [v for v, found in versions.items() if found.state is ModelState.READY]
    if not ready:
        raise TritonError(Code.NOT_FOUND, f"'{name}' has no available versions")
    return versions[max(ready)]
