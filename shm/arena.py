"""A process-private allocator over POSIX shared-memory segments.

The process that allocates a block is the only one that frees it (DESIGN §2); other
processes map the segment by name and read the block in place. Segments are kept for
reuse, so steady-state traffic causes no shm_open/mmap/page-fault churn.
"""
from __future__ import annotations

import bisect
import errno
import mmap
import os
import threading
from dataclasses import dataclass

import posix_ipc

from tritond.wire.errors import unavailable

from .naming import segment_name

ALIGN = 64
DEFAULT_SEGMENT_BYTES = 32 << 20


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


@dataclass
class Block:
    seg: str
    offset: int
    nbytes: int
    view: memoryview


def _reserve(fd: int, name: str, size: int) -> None:
    """Take the segment's pages from the tmpfs now: a sparse segment on a full /dev/shm kills
    its first writer with SIGBUS mid-request; reserved, the allocation fails here instead,
    as a 503 for the request that needed the space."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise unavailable(f"not enough shared memory: /dev/shm cannot hold another {size >> 20} MiB "
                              f"segment for tensors; give the server a larger /dev/shm") from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):   # a file system without fallocate
            raise


class _Segment:
    """One mapped segment with a first-fit free list of (offset, size) kept sorted by offset."""

    def __init__(self, name: str, size: int) -> None:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        try:
            _reserve(shm.fd, name, size)
            self.map = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        self.name = name
        self.size = size
        self.view = memoryview(self.map)
        self.free_offsets: list[int] = [0]
        self.free_sizes: dict[int, int] = {0: size}
        self.used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        need = _align(max(nbytes, 1))
        for off in self.free_offsets:
            size = self.free_sizes[off]
            if size >= need:
                idx = bisect.bisect_left(self.free_offsets, off)
                del self.free_offsets[idx]
                del self.free_sizes[off]
                if size > need:
                    rest = off + need
                    bisect.insort(self.free_offsets, rest)
                    self.free_sizes[rest] = size - need
                self.used[off] = need
                return off
        return None

    def free(self, off: int) -> None:
        size = self.used.pop(off)
        idx = bisect.bisect_left(self.free_offsets, off)
        # Merge with the following free range.
        if idx < len(self.free_offsets) and self.free_offsets[idx] == off + size:
            nxt = self.free_offsets.pop(idx)
            size += self.free_sizes.pop(nxt)
        # Merge with the preceding free range.
        if idx > 0:
            prev = self.free_offsets[idx - 1]
            if prev + self.free_sizes[prev] == off:
                self.free_sizes[prev] += size
                return
        self.free_offsets.insert(idx, off)
        self.free_sizes[off] = size

    def close(self) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:
            pass  # a live numpy view still points here; the mapping goes with the process
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass


class Arena:
    """Blocks for one owner (a frontend or a worker) of one server. Threads of the owner may
    allocate and free concurrently (a model's threads send responses while BLS calls run)."""

    def __init__(self, server_id: str, owner: str, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.server_id = server_id
        self.owner = owner
        self.segment_bytes = segment_bytes
        self.segments: dict[str, _Segment] = {}
        self.lock = threading.Lock()

    def alloc(self, nbytes: int) -> Block:
        with self.lock:
            return self._alloc(nbytes)

    def _alloc(self, nbytes: int) -> Block:
        block = self._fit(nbytes)
        if block is not None:
            return block
        size = _align(self.segment_bytes)
        while size < _align(max(nbytes, 1)):
            size *= 2
        self._add_segment(size)
        block = self._fit(nbytes)
        assert block is not None
        return block

    def alloc_bounded(self, nbytes: int) -> Block | None:
        """A block from one segment of `segment_bytes` at most (created on first use), or None
        when it has no room: for a bounded store that evicts to make room."""
        with self.lock:
            if not self.segments:
                self._add_segment(_align(self.segment_bytes))
            return self._fit(nbytes)

    def _fit(self, nbytes: int) -> Block | None:
        """First fit over the existing segments."""
        for seg in self.segments.values():
            off = seg.alloc(nbytes)
            if off is not None:
                return Block(seg.name, off, nbytes, seg.view[off:off + nbytes])
        return None

    def _add_segment(self, size: int) -> None:
        seg = _Segment(segment_name(self.server_id, self.owner), size)
        self.segments[seg.name] = seg

    def free(self, seg: str, offset: int) -> None:
        """Return a block; unknown blocks are ignored (a release may arrive twice)."""
        with self.lock:
            s = self.segments.get(seg)
            if s is not None and offset in s.used:
                s.free(offset)

    def in_use(self) -> int:
        return sum(len(s.used) for s in self.segments.values())

    def close(self) -> None:
        for seg in self.segments.values():
            seg.close()
        self.segments.clear()
