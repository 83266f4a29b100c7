"""What a model directory holds, as stat signatures, so that a poll or an explicit load can tell
whether a model changed, and which of its versions, without reading any file.

A model's fingerprint has one digest for its config files (`config.pbtxt`, `configs/`), one for
everything else outside its version directories (labels, `warmup/`, ...) and one per version
directory: a load that changes only the config's instance groups can then tell that no file
the model reads changed. A digest covers every entry's
relative path, type, size, modification time and inode, so a file rewritten in place, renamed
over or touched changes it. An entry that vanishes mid-walk makes the digest unique, so a
directory being copied never looks stable.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import stat
from dataclasses import dataclass, field

from .layout import ModelSource

_unstable = itertools.count()


CONFIG_ENTRIES = ("config.pbtxt", "configs")


@dataclass(frozen=True)
class Fingerprint:
    shared: str
    versions: dict[int, str] = field(default_factory=dict)
    path: str = ""                       # the directory it describes (a moved model is a changed one)
    config: str = ""                     # the config files'

    def changed_versions(self, other: "Fingerprint | None") -> set[int]:
        """Versions whose directory differs from `other`'s (all of them when `other` is None)."""
        if other is None:
            return set(self.versions)
        return {v for v, d in self.versions.items() if other.versions.get(v) != d}


def _is_version(name: str) -> bool:
    return name.isascii() and name.isdigit() and name[0] != "0"


def _entry(h: "hashlib._Hash", rel: str, st: os.stat_result) -> None:
    h.update(f"{rel}\0{stat.S_IFMT(st.st_mode)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(
        "utf-8", "surrogateescape"))


def _walk(h: "hashlib._Hash", top: str, rel: str) -> None:
    """Add every entry under `top` (a directory) to `h`, in name order; symbolic links are
    described by their target's stat (a link retargeted or its target rewritten changes it)."""
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        h.update(f"!{next(_unstable)}".encode())
        return
    for e in entries:
        path = f"{rel}/{e.name}" if rel else e.name
        try:
            st = os.stat(e.path)
            if e.is_symlink():
                h.update(f"{path}\0->{os.readlink(e.path)}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            h.update(f"!{next(_unstable)}".encode())
            continue
        _entry(h, path, st)
        if stat.S_ISDIR(st.st_mode) and not e.is_symlink():
            _walk(h, e.path, path)


def fingerprint(model_path: str) -> Fingerprint | None:
    """The fingerprint of a model directory; None when it does not exist (any more)."""
    try:
        with os.scandir(model_path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return None
    shared = hashlib.blake2b(digest_size=16)
    config = hashlib.blake2b(digest_size=16)
    versions: dict[int, str] = {}
    for e in entries:
        try:
            is_dir = e.is_dir()
            st = os.stat(e.path)
        except OSError:
            shared.update(f"!{next(_unstable)}".encode())
            continue
        if is_dir and _is_version(e.name):
            h = hashlib.blake2b(digest_size=16)
            _entry(h, e.name, st)
            _walk(h, e.path, e.name)
            versions[int(e.name)] = h.hexdigest()
            continue
        h = config if e.name in CONFIG_ENTRIES else shared
        _entry(h, e.name, st)
        if is_dir:
            _walk(h, e.path, e.name)
    return Fingerprint(shared.hexdigest(), versions, model_path, config.hexdigest())


def source_fingerprint(source: ModelSource) -> Fingerprint | None:
    """A source that cannot be served (its name is in two repositories) fingerprints as its error,
    so fixing the duplication is a change."""
    if source.error:
        return Fingerprint(f"error:{source.error}", {}, source.path)
    return fingerprint(source.path)
