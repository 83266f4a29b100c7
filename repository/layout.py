"""Where models live on disk: model directories, version directories, safe names.

Triton treats every subdirectory of a repository as a model and every positive
integer subdirectory of a model as a version; this module is the only place
that turns repository paths into model paths.
"""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass

from .remote import is_remote, list_models


@dataclass(frozen=True)
class ModelSource:
    """A model directory found in a repository; `error` is set when it cannot be loaded.
    For a remote repository (`repo` is its URL), `path` is the model's local mirror."""

    name: str
    path: str
    repo: str
    error: str = ""


def scan(repos: list[str]) -> dict[str, ModelSource]:
    """Every model directory of every repository, keyed by model name.

    A name present in two repositories is ambiguous, so it maps to a source with
    `error` set and shows as unavailable. Raises OSError when a local repository
    cannot be listed, RemoteError (repository.remote) when a remote one cannot.
    """
    found: dict[str, ModelSource] = {}
    for repo in repos:
        if is_remote(repo):
            paths = list_models(repo)
        else:
            with os.scandir(repo) as entries:
                paths = {e.name: os.path.join(repo, e.name) for e in entries if e.is_dir()}
        for name in sorted(paths):
            if name in found:
                first = found[name]
                found[name] = ModelSource(
                    name, first.path, first.repo, f"model '{name}' appears in multiple repositories"
                )
            else:
                found[name] = ModelSource(name, paths[name], repo)
    return found


def repository_problem(repo: str) -> str | None:
    """Why a local repository path cannot be served (one line), or None."""
    if is_remote(repo):
        return None
    if not os.path.exists(repo):
        return f"model repository '{repo}' does not exist"
    if not os.path.isdir(repo):
        return f"model repository '{repo}' is not a directory"
    if not os.access(repo, os.R_OK | os.X_OK):
        return f"model repository '{repo}' cannot be read (permission denied)"
    return None


MODEL_FOLDERS = ("configs", "warmup", "initial_state")


def version_dirs(model_path: str) -> list[int]:
    """Version numbers of a model: subdirectories named by a positive integer without leading zeros."""
    try:
        with os.scandir(model_path) as entries:
            names = [e.name for e in entries if e.is_dir()]
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isascii() and n.isdigit() and n[0] != "0")


def ignored_version_dirs(model_path: str) -> list[str]:
    """Triton's warnings for a model's subdirectories that are not versions (its own folders
    configs/, warmup/ and initial_state/ aside)."""
    try:
        with os.scandir(model_path) as entries:
            names = sorted(e.name for e in entries if e.is_dir() and e.name not in MODEL_FOLDERS)
    except OSError:
        return []
    out = []
    for n in names:
        if len(n) > 1 and n[0] == "0":
            out.append(f"ignore version directory '{n}' which contains leading zeros in its directory name")
        elif not (n.isascii() and n.isdigit()):
            out.append(f"ignore version directory '{n}' which fails to convert to integral number")
    return out


MAX_NAME_BYTES = 255    # NAME_MAX: no directory of a longer name exists


def validate_model_name(name: str) -> str | None:
    """Why `name` may not be used as a path component, or None when it is safe.

    Mirrors Triton's check (surrounding whitespace is ignored, so " .." is "..")
    and also refuses ".", NUL bytes, names no file system holds and control characters (a
    newline would split the name across log lines). A backslash is a name's own character here,
    as in Triton (no POSIX path splits at it).
    """
    trimmed = name.strip()
    if not trimmed:
        return "Model name cannot be empty. Please enter a valid name to deploy."
    if len(trimmed.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return (f"invalid model name '{trimmed[:32]}...', model name must not contain path traversal characters "
                f"and must not be longer than {MAX_NAME_BYTES} bytes")
    if trimmed in (".", "..") or any(c in trimmed for c in "/\0"):
        shown = trimmed.replace("\0", "\\0")
        return f"invalid model name '{shown}', model name must not contain path traversal characters"
    if any(unicodedata.category(c) == "Cc" for c in name):
        shown = "".join(c.encode("unicode_escape").decode() if unicodedata.category(c) == "Cc" else c for c in name)
        return f"invalid model name '{shown}', model name must not contain control characters"
    return None
