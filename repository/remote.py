"""Model repositories in object storage, mirrored into a private local cache before loading.

`--model-repository` takes Triton's URL forms:

    s3://bucket/path                  AWS S3 (credentials: AWS_* variables, ~/.aws files, roles)
    s3://host:port/bucket/path        an S3-compatible server over http
    s3://https://host:port/bucket/path  ... over https
    gs://bucket/path                  Google Cloud Storage (GOOGLE_APPLICATION_CREDENTIALS, ...)
    as://account/container/path       Azure Blob Storage (AZURE_STORAGE_KEY, or Azure's usual chain)

Each goes through fsspec (packages s3fs, gcsfs, adlfs: `pip install tritond[s3|gcs|azure]`).
Everything else in tritond sees plain directories: listing a repository (`scan`) brings in
each model's top-level files (config.pbtxt, configs/, labels) so that ensembles can be
ordered, and loading a model (`load_spec`) first mirrors all of it, so every load, an
explicit one included, serves what the bucket holds at that moment (for an explicit load
the frontend mirrors the model first, off the broker's loop, which then finds it current).
Mirroring is
incremental: a file whose size and ETag (or generation) are unchanged is not fetched again;
a changed one is written beside the old and renamed over it, so a running worker keeps the
file it opened; files gone from the bucket are removed.

The cache lives under $TRITOND_MODEL_CACHE_DIR (the supervisor points it into its private
run directory, removed at exit, unless the variable is set, e.g. to a volume that outlives
restarts), in directories of mode 0700, one per repository URL.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

CACHE_ENV = "TRITOND_MODEL_CACHE_DIR"
# URL scheme -> (fsspec protocol, the package that provides it, the extra that installs it)
SCHEMES = {"s3": ("s3", "s3fs", "s3"), "gs": ("gcs", "gcsfs", "gcs"), "as": ("abfs", "adlfs", "azure")}
MANIFEST_DIR = ".tritond-manifests"

log = logging.getLogger("tritond.repository")
_last_listing: dict[str, dict[str, str]] = {}


class RemoteError(Exception):
    """A remote repository cannot be reached, listed or read (the message says which)."""


def is_remote(repo: str) -> bool:
    return repo.partition("://")[0] in SCHEMES and "://" in repo


@dataclass(frozen=True)
class Location:
    """Where a repository lives: the fsspec protocol, its options, and the root path in it."""

    url: str
    protocol: str
    package: str
    extra: str
    root: str
    options: tuple[tuple[str, Any], ...] = ()


def parse(url: str) -> Location:
    """A repository URL in Triton's forms; raises RemoteError for a malformed one."""
    scheme, _, rest = url.partition("://")
    if scheme not in SCHEMES:
        raise RemoteError(f"unsupported model repository URL '{url}': expected s3://, gs:// or as://")
    protocol, package, extra = SCHEMES[scheme]
    options: dict[str, Any] = {}
    if scheme == "s3":
        endpoint = ""
        for proto in ("https://", "http://"):
            if rest.startswith(proto):
                endpoint, rest = proto, rest[len(proto):]
        first, _, tail = rest.partition("/")
        if endpoint or ":" in first:          # s3://host:port/bucket/path (Triton's form)
            endpoint = (endpoint or "http://") + first
            rest = tail
            options["client_kwargs"] = {"endpoint_url": endpoint}
    elif scheme == "as":
        account, _, rest = rest.partition("/")
        if not account:
            raise RemoteError(f"model repository URL '{url}' names no storage account (as://account/container/path)")
        options["account_name"] = account
        if os.environ.get("AZURE_STORAGE_KEY"):
            options["account_key"] = os.environ["AZURE_STORAGE_KEY"]
    root = rest.strip("/")
    if not root:
        raise RemoteError(f"model repository URL '{url}' names no bucket")
    if any(part in ("", ".", "..") for part in root.split("/")):
        raise RemoteError(f"model repository URL '{url}' has an empty, '.' or '..' path component")
    return Location(url, protocol, package, extra, root, tuple(sorted(options.items())))


def check_available(url: str) -> None:
    """Raise RemoteError when the URL is malformed or its fsspec package is not installed."""
    loc = parse(url)
    try:
        __import__(loc.package)
    except ImportError:
        raise RemoteError(f"model repository '{url}' needs the '{loc.package}' package: "
                          f"pip install 'tritond[{loc.extra}]'") from None


def filesystem(loc: Location):
    """The fsspec filesystem of a location (credentials from the environment and the
    usual files, as each cloud's own SDK finds them)."""
    try:
        import fsspec
        return fsspec.filesystem(loc.protocol, **dict(loc.options))
    except ImportError:
        raise RemoteError(f"model repository '{loc.url}' needs the '{loc.package}' package: "
                          f"pip install 'tritond[{loc.extra}]'") from None


# ------------------------------------------------------------------------ the cache

_fallback_cache: str | None = None


def cache_root() -> str:
    """$TRITOND_MODEL_CACHE_DIR, else a private directory of this process removed at exit."""
    global _fallback_cache
    root = os.environ.get(CACHE_ENV)
    if root:
        os.makedirs(root, mode=0o700, exist_ok=True)
        return root
    if _fallback_cache is None:
        _fallback_cache = tempfile.mkdtemp(prefix="tritond-models-")
        atexit.register(shutil.rmtree, _fallback_cache, True)
    return _fallback_cache


def repository_cache(url: str) -> str:
    """The private local directory that mirrors one repository URL."""
    path = os.path.join(cache_root(), hashlib.sha256(url.encode()).hexdigest()[:20])
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


@contextlib.contextmanager
def _locked(repo_dir: str, model: str) -> Iterator[None]:
    """One mirroring of a model at a time, across processes sharing the cache."""
    os.makedirs(os.path.join(repo_dir, MANIFEST_DIR), mode=0o700, exist_ok=True)
    with open(os.path.join(repo_dir, MANIFEST_DIR, model + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ------------------------------------------------------------------------ listing and mirroring

def _version_part(part: str) -> bool:
    return part.isascii() and part.isdigit() and part[0] != "0"


def _token(info: dict[str, Any]) -> str:
    """What changes when an object's content changes: its ETag or generation, and its size."""
    for key in ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime"):
        if info.get(key) is not None:
            return f"{info.get('size')}:{info[key]}"
    return f"{info.get('size')}:"


def list_models(url: str) -> dict[str, str]:
    """Model name -> local mirror directory of every model of a remote repository; the
    models' top-level files are mirrored already (enough to read their configs).

    When the repository cannot be listed, the first time raises RemoteError; later (a
    repository load while the bucket is unreachable) the last listing stands, so that the
    load fails for that model with the reason rather than for the whole repository."""
    try:
        out = _list_models(url)
    except RemoteError as e:
        if url not in _last_listing:
            raise
        log.error("%s; using its last listing", e)
        return dict(_last_listing[url])
    _last_listing[url] = out
    return dict(out)


def _list_models(url: str) -> dict[str, str]:
    loc = parse(url)
    fs = filesystem(loc)
    repo_dir = repository_cache(url)
    fs.invalidate_cache()           # listings are cached per filesystem instance: ask again
    try:
        objects = fs.find(loc.root, detail=True)
    except FileNotFoundError:
        raise RemoteError(f"model repository '{url}' does not exist") from None
    except Exception as e:  # each SDK raises its own kinds: say which repository failed
        raise RemoteError(f"cannot list model repository '{url}': {e}") from None
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for path, info in objects.items():
        rel = posixpath.relpath(path.strip("/"), loc.root)
        parts = rel.split("/")
        if len(parts) < 2 or info.get("type") == "directory":
            continue                              # files beside the models are not models
        by_model.setdefault(parts[0], {})["/".join(parts[1:])] = info
    out = {}
    for model, files in sorted(by_model.items()):
        if model.startswith("."):
            continue
        local = os.path.join(repo_dir, model)
        top_level = {rel: info for rel, info in files.items() if not _version_part(rel.split("/")[0])}
        _mirror(fs, f"{loc.root}/{model}", local, repo_dir, model, top_level, prune=False)
        out[model] = local
    return out


def mirror_model(url: str, model: str) -> str:
    """Mirror every file of one model (all versions) into the cache; its local directory."""
    loc = parse(url)
    fs = filesystem(loc)
    repo_dir = repository_cache(url)
    prefix = f"{loc.root}/{model}"
    fs.invalidate_cache()
    try:
        objects = fs.find(prefix, detail=True)
    except Exception as e:  # each SDK raises its own kinds
        raise RemoteError(f"cannot list model '{model}' in '{url}': {e}") from None
    files = {posixpath.relpath(p.strip("/"), prefix): info for p, info in objects.items()
             if info.get("type") != "directory"}
    if not files:
        raise RemoteError(f"model '{model}' is no longer in '{url}'")
    local = os.path.join(repo_dir, model)
    _mirror(fs, prefix, local, repo_dir, model, files, prune=True)
    return local


def _mirror(fs, prefix: str, local: str, repo_dir: str, model: str,
            files: dict[str, dict[str, Any]], prune: bool) -> None:
    """Bring `local` up to date with `files` (relative path -> object info) under `prefix`;
    with `prune`, also remove local files the listing does not have."""
    with _locked(repo_dir, model):
        manifest_path = os.path.join(repo_dir, MANIFEST_DIR, model + ".json")
        try:
            with open(manifest_path) as f:
                manifest: dict[str, str] = json.load(f)
        except (OSError, ValueError):
            manifest = {}
        os.makedirs(local, mode=0o700, exist_ok=True)
        for rel, info in sorted(files.items()):
            target = _confined(local, rel, model)
            token = _token(info)
            if manifest.get(rel) == token and os.path.isfile(target):
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".part-")
            os.close(fd)
            try:
                fs.get_file(f"{prefix}/{rel}", tmp)
                os.replace(tmp, target)
            except Exception as e:  # each SDK raises its own kinds
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise RemoteError(f"cannot download '{rel}' of model '{model}': {e}") from None
            manifest[rel] = token
        if prune:
            for rel in [r for r in manifest if r not in files]:
                with contextlib.suppress(OSError):
                    os.unlink(_confined(local, rel, model))
                del manifest[rel]
            _remove_empty_dirs(local)
        with open(manifest_path + ".tmp", "w") as f:
            json.dump(manifest, f)
        os.replace(manifest_path + ".tmp", manifest_path)


def _confined(local: str, rel: str, model: str) -> str:
    """The local path of an object, refusing keys that would leave the model's directory."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\0" in rel or "\\" in rel:
        raise RemoteError(f"model '{model}' has an object key that is not a plain relative path: '{rel}'")
    return os.path.join(local, *parts)


def _remove_empty_dirs(top: str) -> None:
    for dirpath, _, _ in os.walk(top, topdown=False):
        if dirpath != top and not os.listdir(dirpath):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
