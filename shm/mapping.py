"""Read-side access to segments owned by other processes (and to client regions).

Mappings are cached by name: a segment is mapped once per process and reused for every
tensor that lives in it.
"""
from __future__ import annotations

import mmap

import posix_ipc


class MappingError(Exception):
    pass


class SegmentMaps:
    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    def _get(self, name: str) -> memoryview:
        entry = self._maps.get(name)
        if entry is None:
            try:
                shm = posix_ipc.SharedMemory(name)
            except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError) as e:
                raise MappingError(str(e)) from None
            try:
                if shm.size == 0:
                    raise MappingError("empty segment")
                m = mmap.mmap(shm.fd, shm.size)
            finally:
                shm.close_fd()
            entry = (m, memoryview(m))
            self._maps[name] = entry
        return entry[1]

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        """A writable view of [offset, offset+nbytes) of the named segment, bounds-checked."""
        mv = self._get(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > len(mv):
            raise MappingError("range outside segment")
        return mv[offset:offset + nbytes]

    def size(self, name: str) -> int:
        return len(self._get(name))

    def drop(self, name: str) -> None:
        entry = self._maps.pop(name, None)
        if entry is not None:
            entry[1].release()
            try:
                entry[0].close()
            except BufferError:
                pass

    def drop_prefix(self, prefix: str) -> None:
        for name in [n for n in self._maps if n.lstrip("/").startswith(prefix)]:
            self.drop(name)

    def close(self) -> None:
        for name in list(self._maps):
            self.drop(name)
