"""The shared-memory arena: first-fit allocation, freeing with merges, reuse, large blocks,
and that closing unlinks every segment it created."""
from __future__ import annotations

import os

import pytest

from tritond.shm.arena import ALIGN, Arena
from tritond.shm.mapping import SegmentMaps
from tritond.shm.naming import new_server_id

SEG = 64 * 1024


@pytest.fixture
def arena():
    a = Arena(new_server_id(), "t", segment_bytes=SEG)
    yield a
    a.close()


def on_disk(a: Arena) -> set[str]:
    prefix = f"tritond.{a.server_id}."
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def test_blocks_are_aligned_disjoint_and_writable(arena):
    blocks = [arena.alloc(n) for n in (1, 100, 64, 65, 1000)]
    for b in blocks:
        assert b.offset % ALIGN == 0
        assert len(b.view) == b.nbytes
    spans = sorted((b.offset, b.offset + b.nbytes) for b in blocks)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for i, b in enumerate(blocks):
        b.view[:] = bytes([i + 1]) * b.nbytes
    for i, b in enumerate(blocks):
        assert bytes(b.view) == bytes([i + 1]) * b.nbytes
    assert arena.in_use() == len(blocks)


def test_another_process_view_sees_the_bytes(arena):
    block = arena.alloc(256)
    block.view[:] = bytes(range(256))
    maps = SegmentMaps()
    try:
        assert bytes(maps.view(block.seg, block.offset, 256)) == bytes(range(256))
    finally:
        maps.close()


def test_free_then_reuse_same_offset(arena):
    a = arena.alloc(1000)
    arena.free(a.seg, a.offset)
    b = arena.alloc(1000)
    assert (b.seg, b.offset) == (a.seg, a.offset)
    assert len(arena.segments) == 1


def test_free_merges_neighbours_both_ways(arena):
    a, b, c = arena.alloc(1024), arena.alloc(1024), arena.alloc(1024)
    seg = arena.segments[a.seg]
    arena.free(a.seg, a.offset)
    arena.free(c.seg, c.offset)
    arena.free(b.seg, b.offset)       # merges with the free range before and after
    assert seg.free_offsets == [0]
    assert seg.free_sizes == {0: SEG}
    assert arena.in_use() == 0
    whole = arena.alloc(SEG)          # the merged range serves a block the size of the segment
    assert (whole.seg, whole.offset) == (a.seg, 0)


def test_first_fit_fills_a_hole(arena):
    a, b, _ = arena.alloc(4096), arena.alloc(4096), arena.alloc(4096)
    arena.free(a.seg, a.offset)
    small = arena.alloc(100)
    assert small.offset == a.offset
    arena.free(b.seg, b.offset)
    assert arena.alloc(4096 + 4096 - 128).offset == ALIGN * 2


def test_double_and_unknown_free_are_ignored(arena):
    a = arena.alloc(10)
    arena.free(a.seg, a.offset)
    arena.free(a.seg, a.offset)
    arena.free("/tritond.nope", 0)
    arena.free(a.seg, 12345)
    assert arena.in_use() == 0


def test_full_segment_adds_another(arena):
    first = arena.alloc(SEG)
    second = arena.alloc(1)
    assert first.seg != second.seg
    assert len(arena.segments) == 2
    assert on_disk(arena) == {n.lstrip("/") for n in arena.segments}


def test_large_block_gets_its_own_segment_and_is_reused(arena):
    big = arena.alloc(5 * SEG + 3)
    seg = arena.segments[big.seg]
    assert seg.size >= 5 * SEG + 3 and seg.size % ALIGN == 0
    big.view[-1] = 7
    arena.free(big.seg, big.offset)
    again = arena.alloc(4 * SEG)
    assert again.seg == big.seg


def test_odd_segment_size_still_fits_a_block_of_that_size():
    a = Arena(new_server_id(), "t", segment_bytes=1000)
    try:
        block = a.alloc(999)
        assert block.nbytes == 999
    finally:
        a.close()


def test_zero_byte_block(arena):
    a, b = arena.alloc(0), arena.alloc(0)
    assert a.offset != b.offset
    assert len(a.view) == 0


def test_names_carry_server_and_owner_and_are_unguessable(arena):
    a = arena.alloc(1)
    b = Arena(arena.server_id, "t", segment_bytes=SEG)
    try:
        other = b.alloc(1)
        assert a.seg.startswith(f"/tritond.{arena.server_id}.t.")
        assert a.seg != other.seg
        assert len(a.seg.rsplit(".", 1)[1]) >= 16
    finally:
        b.close()


def test_close_unlinks_every_segment():
    a = Arena(new_server_id(), "t", segment_bytes=SEG)
    a.alloc(SEG)
    a.alloc(SEG)
    a.alloc(3 * SEG)
    assert len(on_disk(a)) == 3
    a.close()
    assert on_disk(a) == set()
    assert a.segments == {}


def test_close_with_a_live_view_still_unlinks():
    a = Arena(new_server_id(), "t", segment_bytes=SEG)
    block = a.alloc(64)
    held = block.view
    a.close()
    assert on_disk(a) == set()
    del held


def test_a_full_dev_shm_is_a_503_not_a_sigbus_later(arena, monkeypatch):
    """Segments are reserved when created, so running out of /dev/shm fails the allocation
    (and the request that needed it) rather than killing the first writer of a sparse page."""
    import errno

    import numpy as np

    from tritond.shm import arena as arena_module
    from tritond.wire.errors import Code, TritonError
    from tritond.wire.schema import OutputSpec
    from tritond.workers.tensors import Leases, write_outputs

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(arena_module.os, "posix_fallocate", full)
    with pytest.raises(TritonError) as e:
        arena.alloc(10)
    assert e.value.code is Code.UNAVAILABLE and "not enough shared memory" in e.value.message
    assert on_disk(arena) == set()
    big = np.ones(1 << 16, np.float32)            # over the inline limit: goes to the arena
    (result,) = write_outputs([({"Y": big}, [OutputSpec("Y")], None)], SegmentMaps(), Leases(arena))
    assert result.error.code is Code.UNAVAILABLE and result.outputs == []
