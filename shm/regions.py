"""Client-registered system shared-memory regions (Triton's shared-memory extension).

Pure bookkeeping and bounds checks, with Triton's error texts. A region is opened by key
only to learn its size at registration; workers map it themselves and read it in place.
Regions in use by in-flight requests are unregistered lazily: removed from the name table
at once, forgotten (and unmapped by workers) when their last request finishes.
"""
from __future__ import annotations

from dataclasses import dataclass

import posix_ipc

from .naming import is_internal_key

U64_MAX = (1 << 64) - 1


class RegionError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    users: int = 0
    retired: bool = False

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _object_size(key: str) -> int:
    try:
        shm = posix_ipc.SharedMemory(key)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError):
        raise RegionError("INTERNAL", f"Unable to open shared memory region: '{key}'") from None
    size = shm.size
    shm.close_fd()
    return size


class RegionTable:
    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}
        self.retired: list[Region] = []

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        if name in self.regions:
            raise RegionError("ALREADY_EXISTS", f"shared memory region '{name}' already in manager")
        stripped = key.lstrip("/")
        if not stripped:
            raise RegionError("INVALID_ARG", f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
        if is_internal_key(key) or stripped.startswith("triton_python_backend_shm_region_"):
            raise RegionError("INVALID_ARG", f"cannot register shared memory region '{name}' - the key is reserved for internal use")
        if offset < 0 or byte_size < 0 or offset > U64_MAX or byte_size > U64_MAX:
            raise RegionError("INVALID_ARG", f"failed to register shared memory region '{name}': invalid args")
        size = _object_size("/" + stripped)
        if offset + byte_size > size:
            raise RegionError("INVALID_ARG", f"failed to register shared memory region '{name}': invalid args")
        region = Region(name, "/" + stripped, offset, byte_size)
        self.regions[name] = region
        return region

    def unregister(self, name: str | None) -> list[str]:
        """Remove one region (unknown: no-op) or all; returns keys that are now free to unmap."""
        names = [name] if name else list(self.regions)
        freed: list[str] = []
        for n in names:
            region = self.regions.pop(n, None)
            if region is None:
                continue
            if region.users:
                region.retired = True
                self.retired.append(region)
            else:
                freed.append(region.key)
        return [k for k in freed if not self.key_in_use(k)]

    def key_in_use(self, key: str) -> bool:
        return any(r.key == key for r in self.regions.values()) or any(r.key == key for r in self.retired)

    def status(self, name: str | None) -> list[dict]:
        if name:
            region = self.regions.get(name)
            if region is None:
                raise RegionError("NOT_FOUND", f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [r.status() for r in self.regions.values()]

    def resolve(self, name: str, offset: int, byte_size: int) -> tuple[Region, int]:
        """Check a use of [offset, offset+byte_size) of a region; return (region, absolute offset)."""
        region = self.regions.get(name)
        if region is None:
            raise RegionError("NOT_FOUND", f"Unable to find shared memory region: '{name}'")
        if offset < 0 or byte_size < 0:
            raise RegionError("INVALID_ARG", f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > U64_MAX:
            raise RegionError(
                "INVALID_ARG",
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value "
                f"({U64_MAX}) for region '{name}'",
            )
        if offset >= region.byte_size and not (offset == 0 and byte_size == 0):
            raise RegionError("INVALID_ARG", f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise RegionError("INVALID_ARG", f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset

    def acquire(self, region: Region) -> None:
        region.users += 1

    def release(self, region: Region) -> list[str]:
        """Drop one use; returns keys to unmap when a retired region's last user finished."""
        region.users -= 1
        if region.users == 0 and region.retired:
            self.retired.remove(region)
            return [] if self.key_in_use(region.key) else [region.key]
        return []
