"""Names of our shared-memory segments.

Every segment is `/tritond.<server-id>.<owner>.<random>`: the server id (128 random bits)
lets the supervisor sweep everything of one server, the owner part lets the broker reclaim a
dead worker's segments, and the random tail makes names unguessable.
"""
from __future__ import annotations

import os
import secrets

import posix_ipc

PREFIX = "tritond."
SHM_DIR = "/dev/shm"


def new_server_id() -> str:
    return secrets.token_hex(16)


def owner_prefix(server_id: str, owner: str) -> str:
    """Prefix (without leading slash) shared by every segment one owner creates."""
    return f"{PREFIX}{server_id}.{owner}."


def segment_name(server_id: str, owner: str) -> str:
    return "/" + owner_prefix(server_id, owner) + secrets.token_hex(8)


def is_internal_key(key: str) -> bool:
    """True when a client-supplied key would name one of our segments (any leading slashes)."""
    return key.lstrip("/").startswith(PREFIX)


def internal_inodes() -> set[tuple[int, int]]:
    """(device, inode) of every segment named like ours, of any server on this host."""
    found = set()
    try:
        with os.scandir(SHM_DIR) as entries:
            for entry in entries:
                if entry.name.startswith(PREFIX):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    found.add((st.st_dev, st.st_ino))
    except FileNotFoundError:
        pass
    return found


def sweep(prefix: str) -> int:
    """Unlink every segment whose name starts with `prefix`; returns how many went."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if name.startswith(prefix):
            try:
                posix_ipc.unlink_shared_memory("/" + name)
                removed += 1
            except posix_ipc.ExistentialError:
                pass
    return removed
