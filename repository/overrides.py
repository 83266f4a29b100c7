"""Model file overrides (`file:<version>/<name>` load parameters), written to a private directory.

Triton loads a model with file overrides from a fresh temporary directory holding only the
given files (the `config` parameter is its configuration). Override names come from the
network, so every name is checked before anything is written (CVE-2023-31036, SECURITY-ANCHORS
V1/V2): no `..`, no NUL, no path through a symbolic link, nothing but regular files created
anew, and a bound on the total size. A leading `/` names the model directory, as Triton joins it. The directories live under the
server's private run directory (mode 0700), never in the model repository.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile

from tritond.wire.errors import internal, invalid

OVERRIDES = "overrides"
DEFAULT_MAX_BYTES = 256 << 20
FILE_PREFIX = "file:"
CONFIG_FILE = "config.pbtxt"


def override_root(run_dir: str) -> str:
    return os.path.join(run_dir, OVERRIDES)


def _shown(key: str) -> str:
    return key.replace("\0", "\\0")


def _escapes(key: str) -> Exception:
    return invalid(f"Invalid file parameter '{_shown(key)}' must stay within model directory.")


def override_parts(key: str) -> list[str]:
    """The path components of a `file:` parameter name; raises INVALID_ARG for a name that
    could leave the model directory or name nothing."""
    rel = key[len(FILE_PREFIX):]
    if "\0" in rel:
        raise invalid(f"Invalid file parameter '{_shown(key)}': a file name must not contain NUL")
    if "\\" in rel:
        raise _escapes(key)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _escapes(key)
    if not parts:
        raise invalid(f"Invalid file parameter '{_shown(key)}': it names no file")
    if parts == [CONFIG_FILE]:
        raise invalid(f"Invalid file parameter '{_shown(key)}': the model configuration is given "
                      f"by the 'config' load parameter")
    return parts


def check_overrides(files: dict[str, bytes], limit: int) -> None:
    """Every name safe and the total size within `limit` (INVALID_ARG otherwise)."""
    for key in files:
        override_parts(key)
    total = sum(len(v) for v in files.values())
    if total > limit:
        raise invalid(f"the 'file:' load parameters hold {total} bytes, more than the {limit} bytes "
                      f"allowed (--model-file-override-max-bytes)")


def _open_dir(parent: int, name: str, key: str) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP or stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
            raise _escapes(key) from None
        if e.errno == errno.ENOTDIR:
            raise invalid(f"Invalid file parameter '{_shown(key)}', directory has been created as a file") from None
        raise


def _write(top: int, key: str, data: bytes) -> None:
    parts = override_parts(key)
    fd = os.dup(top)
    try:
        for name in parts[:-1]:
            nxt = _open_dir(fd, name, key)
            os.close(fd)
            fd = nxt
        try:
            out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        except FileExistsError:
            raise invalid(f"Invalid file parameter '{_shown(key)}': the file is given more than once, "
                          f"or a directory of that name exists") from None
        with os.fdopen(out, "wb") as f:
            f.write(data)
    finally:
        os.close(fd)


def write_overrides(run_dir: str, model: str, files: dict[str, bytes], limit: int = DEFAULT_MAX_BYTES) -> str:
    """Write `files` into a new private model directory named `model`; returns its path.
    Raises INVALID_ARG (and leaves nothing behind) when a name or the size is refused, INTERNAL
    when the file system refuses a file (as Triton, which answers 500 there)."""
    check_overrides(files, limit)
    os.makedirs(override_root(run_dir), mode=0o700, exist_ok=True)
    root = os.path.realpath(override_root(run_dir))
    tmp = tempfile.mkdtemp(prefix="load-", dir=root)
    model_dir = os.path.join(tmp, model)
    try:
        os.mkdir(model_dir, 0o700)
        top = os.open(model_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for key, data in files.items():
                try:
                    _write(top, key, data)
                except OSError as e:     # e.g. a name over NAME_MAX: Triton's status and words
                    raise internal(f"failed to poll from model repository: cannot write file parameter "
                                   f"'{_shown(key)}': {e.strerror}") from None
        finally:
            os.close(top)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return model_dir


def is_override_dir(run_dir: str, path: str, model: str) -> bool:
    """True when `path` is a model directory `write_overrides` made for `model`."""
    root = os.path.realpath(override_root(run_dir))
    return (os.path.basename(path) == model and os.path.dirname(os.path.dirname(path)) == root
            and os.path.realpath(path) == path and os.path.isdir(path))


def remove_override_dir(model_dir: str) -> None:
    shutil.rmtree(os.path.dirname(model_dir), ignore_errors=True)
