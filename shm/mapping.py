"""Read-side access to segments owned by other processes, and to client regions.

Mappings are cached by name: a segment is mapped once per process and reused for every
tensor that lives in it. A client's object can shrink under us (ftruncate) and touching a
page past its end would kill the process with SIGBUS, so for client regions the descriptor
stays open and every use re-checks the object's current size (one fstat). CUDA locations
(`cuda:...`) are handed to `CudaMaps`, created on first use.
"""
from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

import posix_ipc

from .naming import internal_inodes, is_internal_key
from .regions import CUDA_PREFIX

if TYPE_CHECKING:
    from .cuda import CudaMaps


class MappingError(Exception):
    pass


class _Mapping:
    __slots__ = ("map", "view", "fd")

    def __init__(self, m: mmap.mmap, fd: int) -> None:
        self.map = m
        self.view = memoryview(m)
        self.fd = fd    # -1 for our own segments, which never shrink


def _aliases_internal(fd: int) -> bool:
    """A client's key that is a hard link to one of our segments (made after registration)."""
    st = os.fstat(fd)
    return st.st_nlink > 1 and (st.st_dev, st.st_ino) in internal_inodes()


class SegmentMaps:
    def __init__(self) -> None:
        self._maps: dict[str, _Mapping] = {}
        self._cuda: CudaMaps | None = None

    def _get(self, name: str) -> _Mapping:
        entry = self._maps.get(name)
        if entry is None:
            try:
                shm = posix_ipc.SharedMemory(name)
            except (posix_ipc.Error, OSError, ValueError):
                raise MappingError("shared memory segment is unavailable") from None
            keep = not is_internal_key(name)
            try:
                if shm.size == 0:
                    raise MappingError("shared memory segment is empty")
                if keep and _aliases_internal(shm.fd):
                    raise MappingError("shared memory region is reserved for internal use")
                m = mmap.mmap(shm.fd, shm.size)
            except BaseException:
                shm.close_fd()
                raise
            if not keep:
                shm.close_fd()
            entry = _Mapping(m, shm.fd if keep else -1)
            self._maps[name] = entry
        return entry

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        """A writable view of [offset, offset+nbytes) of the named segment, bounds-checked."""
        entry = self._get(name)
        end = offset + nbytes
        if offset < 0 or nbytes < 0 or end > len(entry.view):
            raise MappingError("range outside segment")
        if entry.fd >= 0 and end > os.fstat(entry.fd).st_size:
            raise MappingError("shared memory region shrank below the requested range")
        return entry.view[offset:end]

    @property
    def cuda(self) -> "CudaMaps":
        if self._cuda is None:
            from .cuda import CudaMaps
            self._cuda = CudaMaps()
        return self._cuda

    def drop(self, name: str) -> None:
        if name.startswith(CUDA_PREFIX):
            if self._cuda is not None:
                self._cuda.drop(name)
            return
        entry = self._maps.pop(name, None)
        if entry is None:
            return
        entry.view.release()
        try:
            entry.map.close()
        except BufferError:
            pass  # a live numpy view still points here; the mapping goes with its last view
        if entry.fd >= 0:
            os.close(entry.fd)

    def drop_prefix(self, prefix: str) -> None:
        for name in [n for n in self._maps if n.lstrip("/").startswith(prefix)]:
            self.drop(name)

    def close(self) -> None:
        for name in list(self._maps):
            self.drop(name)
        if self._cuda is not None:
            self._cuda.close()
