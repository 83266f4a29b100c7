"""Triton's model/version lookup with its exact error texts, shared by the broker's registry
and the frontends' copy of the model table."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from .errors import Code, TritonError
from .schema import ModelState


class Versioned(Protocol):
    state: ModelState
    restarting: bool


V = TypeVar("V", bound=Versioned)
UNKNOWN = "Request for unknown model: "


def resolve(name: str, version: int, versions: Mapping[int, V] | None, known: bool,
            restarting_ok: bool = False) -> V:
    """The version serving (name, version): `version` < 0 means the latest READY one.
    `versions` is None when the model is not loaded; `known` says whether the repository
    has a model of that name. With `restarting_ok` (an inference request, which may wait in
    the queue) a version whose instances are restarting serves when no READY one does:
    restarting is not a missing model. Every message starts "Request for unknown model: ", as
    Triton's repository manager words all of them (clients and its qa tests match on it)."""
    if versions is None:
        if known:
            raise TritonError(Code.NOT_FOUND, f"{UNKNOWN}'{name}' is not found")
        raise TritonError(Code.INVALID_ARG, f"{UNKNOWN}'{name}' is not found")
    if version >= 0:
        found = versions.get(version)
        if found is None:
            raise TritonError(Code.NOT_FOUND, f"{UNKNOWN}'{name}' version {version} is not found")
        if found.state is not ModelState.READY and not (restarting_ok and found.restarting):
            raise TritonError(Code.UNAVAILABLE, f"{UNKNOWN}'{name}' version {version} is not at ready state")
        return found
    ready = [v for v, found in versions.items() if found.state is ModelState.READY]
    if not ready and restarting_ok:
        ready = [v for v, found in versions.items() if found.restarting]
    if not ready:
        raise TritonError(Code.NOT_FOUND, f"{UNKNOWN}'{name}' has no available versions")
    return versions[max(ready)]
