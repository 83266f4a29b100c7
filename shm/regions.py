"""Client-registered shared-memory regions (Triton's system and CUDA shared-memory extensions).

Pure bookkeeping and bounds checks, with Triton's error texts. A system region is opened by
key only to learn its size at registration; workers map it themselves and read it in place.
System and CUDA regions share one name space, as in Triton. A region unregistered while
requests use it stays listed (and usable) until its last request finishes; only then is it
forgotten and its location handed back for workers to unmap.

Every region has a `location`, the string workers map: the normalized shm key (`/name`) for
system memory, or `cuda:<device>:<byte_size>:<hex handle>` for a CUDA IPC allocation.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import posix_ipc

from tritond.wire.errors import Code, TritonError

from .naming import internal_inodes, is_internal_key

U64_MAX = (1 << 64) - 1
SYSTEM = "system"
CUDA = "cuda"
CUDA_PREFIX = "cuda:"
CUDA_HANDLE_BYTES = 64
PYTHON_BACKEND_PREFIX = "triton_python_backend_shm_region_"


@dataclass
class Region:
    name: str
    key: str                # as the client gave it (system memory); "" for CUDA
    offset: int             # where the region starts inside the object (0 for CUDA)
    byte_size: int
    location: str
    kind: str = SYSTEM
    device_id: int = 0
    users: int = 0
    retiring: bool = False


def cuda_location(device_id: int, byte_size: int, handle: bytes) -> str:
    return f"{CUDA_PREFIX}{device_id}:{byte_size}:{handle.hex()}"


def parse_cuda_location(location: str) -> tuple[int, int, bytes]:
    """(device id, registered byte size, raw cudaIpcMemHandle_t) of a CUDA location."""
    device, size, handle = location[len(CUDA_PREFIX):].split(":")
    return int(device), int(size), bytes.fromhex(handle)


def _object_size(name: str, key: str, path: str) -> int:
    """Size of the client's object; refuses one that is (a hard link to) our own segment."""
    try:
        shm = posix_ipc.SharedMemory(path)
    except (posix_ipc.Error, OSError, ValueError):
        raise TritonError(Code.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
    try:
        st = os.fstat(shm.fd)
    finally:
        shm.close_fd()
    if st.st_nlink > 1 and (st.st_dev, st.st_ino) in internal_inodes():
        raise TritonError(Code.INVALID_ARG, f"cannot register shared memory region '{name}' - "
                                         f"the key is reserved for internal use")
    return st.st_size


def _is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX


def _check_nonempty(name: str, byte_size: int) -> None:
    """Triton cannot map zero bytes and refuses such a region (with mmap's error); so do we,
    as the client's mistake it is."""
    if byte_size == 0:
        raise TritonError(Code.INVALID_ARG, f"failed to register shared memory region '{name}': invalid args "
                                            f"(byte_size must be greater than 0)")


class RegionTable:
    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    # ------------------------------------------------------------ registration

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        stripped = key.lstrip("/") if isinstance(key, str) else ""
        if stripped.startswith(PYTHON_BACKEND_PREFIX):
            raise TritonError(Code.INVALID_ARG, f"cannot register shared memory region '{name}' with key '{key}' as "
                                             f"the key contains the reserved prefix '{PYTHON_BACKEND_PREFIX}'")
        if is_internal_key(stripped):
            # Never echo the key: it names (or imitates) one of the server's own segments.
            raise TritonError(Code.INVALID_ARG, f"cannot register shared memory region '{name}' - "
                                             f"the key is reserved for internal use")
        self._check_new(name)
        if not stripped or "/" in stripped or "\0" in stripped:
            raise TritonError(Code.INVALID_ARG, f"cannot register shared memory region '{name}' - "
                                             f"invalid shm key '{key}'")
        if not _is_uint(offset) or not _is_uint(byte_size):
            raise TritonError(Code.INVALID_ARG, f"failed to register shared memory region '{name}': invalid args")
        path = "/" + stripped
        if offset + byte_size > _object_size(name, key, path):
            raise TritonError(Code.INVALID_ARG, f"failed to register shared memory region '{name}': invalid args")
        _check_nonempty(name, byte_size)
        region = Region(name, key, offset, byte_size, path)
        self.regions[name] = region
        return region

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> Region:
        """Record a CUDA IPC allocation; workers open (and size-check) the handle on first use."""
        self._check_new(name)
        if not isinstance(handle, bytes) or len(handle) != CUDA_HANDLE_BYTES \
                or not _is_uint(device_id) or not _is_uint(byte_size):
            raise TritonError(Code.INVALID_ARG, f"failed to register shared memory region '{name}': invalid args")
        _check_nonempty(name, byte_size)
        region = Region(name, "", 0, byte_size, cuda_location(device_id, byte_size, handle), CUDA, device_id)
        self.regions[name] = region
        return region

    def _check_new(self, name: str) -> None:
        if name in self.regions:
            raise TritonError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")

    def unregister(self, name: str | None, kind: str = SYSTEM) -> list[str]:
        """Remove one region of `kind` (unknown or other kind: no-op) or all of that kind.

        Returns the locations workers may unmap now; regions still in use are marked and
        go when their last request releases them.
        """
        names = [name] if name else [n for n, r in self.regions.items() if r.kind == kind]
        gone: list[str] = []
        for n in names:
            region = self.regions.get(n)
            if region is None or region.kind != kind:
                continue
            if region.users:
                region.retiring = True
            else:
                del self.regions[n]
                gone.append(region.location)
        return [loc for loc in dict.fromkeys(gone) if not self._location_in_use(loc)]

    def _location_in_use(self, location: str) -> bool:
        return any(r.location == location for r in self.regions.values())

    # ------------------------------------------------------------ queries

    def listed(self, name: str | None, kind: str = SYSTEM) -> list[Region]:
        """The regions a status request for `name` (None: every region of `kind`) lists."""
        if not name:
            return [r for r in self.regions.values() if r.kind == kind]
        region = self.regions.get(name)
        label = "system" if kind == SYSTEM else "cuda"
        if region is None:
            raise TritonError(Code.NOT_FOUND, f"Unable to find {label} shared memory region: '{name}'")
        if region.kind != kind:
            have, want = ("CUDA", "system") if region.kind == CUDA else ("system", "CUDA")
            raise TritonError(Code.NOT_FOUND, f"The region named '{name}' is registered as {have} shared memory, "
                                           f"not {want} shared memory")
        return [region]

    def resolve(self, name: str, offset: int, byte_size: int) -> tuple[Region, int]:
        """Check a use of [offset, offset+byte_size) of a region, in Triton's order of checks;
        return (region, offset from the start of the region's location)."""
        region = self.regions.get(name)
        if region is None:
            raise TritonError(Code.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        last = max(region.byte_size - 1, 0)
        if not _is_uint(offset) or offset > last:
            raise TritonError(Code.INVALID_ARG, f"Invalid offset for shared memory region: '{name}'")
        if not _is_uint(byte_size) or byte_size > U64_MAX - offset:
            raise TritonError(Code.INVALID_ARG, f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum value "
                f"({U64_MAX}) for region '{name}'",
            )
        if offset + byte_size > region.byte_size:
            raise TritonError(Code.INVALID_ARG, f"Invalid offset + byte size for shared memory region: '{name}'")
        return region, region.offset + offset

    # ------------------------------------------------------------ in-flight uses

    def acquire(self, region: Region) -> None:
        region.users += 1

    def release(self, region: Region) -> list[str]:
        """Drop one use; returns locations to unmap once a retiring region's last user is done."""
        region.users -= 1
        if region.users > 0 or not region.retiring:
            return []
        if self.regions.get(region.name) is region:
            del self.regions[region.name]
        return [] if self._location_in_use(region.location) else [region.location]
