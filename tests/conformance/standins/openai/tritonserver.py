"""Import-only stand-in for Triton's in-process `tritonserver` module.

Triton's openai tests import it (and the frontend modules that name its types) at import time;
tritond runs as another process, so nothing here serves. Any use of the in-process API fails
with IN_PROCESS, which the suite records as a skip.
"""
from __future__ import annotations

IN_PROCESS = "Triton's in-process tritonserver API is not available against tritond"


class _Unavailable:
    """A name of the module: attributes resolve to more such names, using one raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{IN_PROCESS} (tritonserver.{self._name})")

    def __repr__(self) -> str:
        return f"<tritonserver.{self._name}: {IN_PROCESS}>"


class TritonError(Exception):
    """Named in `except` clauses; never raised here."""


class InvalidArgumentError(TritonError):
    """Named in `except` clauses; never raised here."""


def __getattr__(name: str) -> _Unavailable:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(name)
