"""Poll mode's decisions: which models to load, reload or unload after a rescan.

A half-copied model directory must never be loaded, so a change is acted on only once two
successive scans, one poll interval apart, saw the same fingerprint: a model that keeps
changing (a copy in progress) waits, and so does one that just vanished (an `rm -r` that is
still deleting). What the broker then loads is remembered as applied; a failed load is not
retried until the directory changes again, as in Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

from .fingerprint import Fingerprint

ADD, MODIFY, REMOVE = "add", "modify", "remove"


@dataclass(frozen=True)
class Change:
    name: str
    kind: str                          # add | modify | remove
    now: Fingerprint | None            # None: removed
    before: Fingerprint | None         # None: added


class PollState:
    def __init__(self) -> None:
        self.applied: dict[str, Fingerprint] = {}
        self._seen: dict[str, Fingerprint | None] = {}   # a change seen once, awaiting a second look

    @property
    def pending(self) -> bool:
        """Some change was seen once and awaits its confirming scan."""
        return bool(self._seen)

    def baseline(self, snapshot: dict[str, Fingerprint]) -> None:
        """What the startup load served."""
        self.applied = dict(snapshot)
        self._seen.clear()

    def observe(self, snapshot: dict[str, Fingerprint], busy: frozenset[str] = frozenset()) -> list[Change]:
        """The changes that stayed the same since the previous scan, in name order. Models in
        `busy` (an operation on them still runs) are looked at again next time."""
        changes: list[Change] = []
        for name in sorted(set(snapshot) | set(self.applied)):
            now = snapshot.get(name)
            before = self.applied.get(name)
            if now == before:
                self._seen.pop(name, None)
                continue
            if name in busy:
                continue
            if name in self._seen and self._seen[name] == now:
                del self._seen[name]
                kind = ADD if before is None else REMOVE if now is None else MODIFY
                changes.append(Change(name, kind, now, before))
                if now is None:
                    del self.applied[name]
                else:
                    self.applied[name] = now
            else:
                self._seen[name] = now
        return changes
