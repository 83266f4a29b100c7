"""Reloading a model without downtime: which versions to (re)load, keep or drop, and the switch.

A reload is a second set of workers (DESIGN §10). When some version of the model serves, the
new versions are staged off the table: their workers start and warm up while the old ones
keep serving; once every staged version settled, the model's entry in the table is replaced
in one step. Requests already queued on or executing in an old version finish there, since
they hold it; the old version then retires (retire.py). A staged version that failed leaves
the old one serving (with the failure as its reason in the repository index) and fails the
load. When nothing of the model serves, the new versions go into the table at once, LOADING.

Which versions: a change to the config or to anything outside the version directories
reloads all of them; otherwise only versions whose directory changed (or that do not serve)
reload, new ones load, and those the version policy no longer selects are dropped.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tritond.repository.fingerprint import Fingerprint

from tritond.broker.tables.model_version import LOADING, READY, UNAVAILABLE, ModelVersion

log = logging.getLogger("tritond.broker")


@dataclass(frozen=True)
class LoadedFrom:
    """What a model was loaded from: its directory, its config (after completion and
    normalization, as JSON) and the fingerprint of its files."""
    path: str
    config: Any
    fingerprint: Fingerprint | None
    overridden: bool = False         # the config came with the load request


@dataclass
class Switch:
    load: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)

    @property
    def nothing(self) -> bool:
        return not self.load and not self.drop


def plan(old: dict[int, ModelVersion], before: LoadedFrom | None, now: LoadedFrom, versions: list[int],
         force: bool) -> Switch:
    """The versions to load, keep and drop when `now` replaces `before` (`force`: everything
    reloads, as for a load carrying a `config` parameter)."""
    fp_now = now.fingerprint
    fp_before = before.fingerprint if before is not None else None
    everything = (force or before is None or fp_now is None or fp_before is None or before.path != now.path
                  or before.config != now.config or fp_before.shared != fp_now.shared)
    out = Switch()
    for v in versions:
        mv = old.get(v)
        if (not everything and mv is not None and mv.state == READY and not mv.view.ensemble
                and fp_now.versions.get(v) == fp_before.versions.get(v)):
            out.keep.append(v)
        else:
            out.load.append(v)
    out.drop = sorted(v for v in old if v not in versions)
    return out


def serving(old: dict[int, ModelVersion]) -> bool:
    return any(mv.state == READY for mv in old.values())


def settled(staged: dict[int, ModelVersion]) -> bool:
    return all(mv.state != LOADING for mv in staged.values())


@dataclass
class Outcome:
    table: dict[int, ModelVersion]          # the model's new entry
    retired: list[ModelVersion]             # old versions leaving the table
    discarded: list[ModelVersion]           # staged versions that failed behind a serving one
    failures: list[tuple[int, str]]         # (version, reason) of every staged version that failed


def switch(name: str, old: dict[int, ModelVersion], staged: dict[int, ModelVersion], versions: list[int]) -> Outcome:
    """The model's entry once the staged versions settled: READY staged versions replace the
    old ones; a failed one is kept out when an old version of that number still serves."""
    table: dict[int, ModelVersion] = {}
    failures: list[tuple[int, str]] = []
    discarded: list[ModelVersion] = []
    for v in versions:
        mv = staged.get(v)
        if mv is None:
            table[v] = old[v]
            continue
        if mv.state == READY:
            table[v] = mv
            continue
        failures.append((v, mv.reason))
        prev = old.get(v)
        if prev is not None and prev.state == READY:
            prev.reload_error = f"a reload failed, this version still serves: {mv.reason}"
            log.error("model '%s' version %d: the reload failed; the loaded version keeps serving", name, v)
            table[v] = prev
            discarded.append(mv)
        else:
            table[v] = mv
    kept = {id(mv) for mv in table.values()}
    retired = [mv for mv in old.values() if id(mv) not in kept]
    return Outcome(table, retired, discarded, failures)


def failed_entry(name: str, path: str, versions: list[int], error: str) -> dict[int, ModelVersion]:
    """The table entry of a model that cannot be loaded at all (bad config, no version)."""
    return {v: ModelVersion(name, v, path, "", None, UNAVAILABLE, error) for v in versions or [0]}
