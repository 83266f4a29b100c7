"""The HTTP body sink's block and budget: the binary part lands aligned, the block is freed
once (not when the route took it), bytes after a release are only counted, and a body's bytes
count against the per-process budget until it is in or its block is freed."""
from __future__ import annotations

import pytest

from tritond.frontend.http.sink import BodySink, SinkBudget
from tritond.shm.arena import ALIGN, Arena
from tritond.shm.naming import new_server_id


@pytest.fixture
def arena():
    a = Arena(new_server_id(), "t", segment_bytes=1 << 20)
    yield a
    a.close()


def test_the_binary_part_starts_aligned_and_the_body_is_written_in_order(arena):
    budget = SinkBudget()
    assert budget.take(1000)
    sink = BodySink(arena, budget, 1000, header_len=37)
    assert (sink.base + 37) % ALIGN == 0
    sink.write(b"a" * 600)
    rest = sink.rest()
    assert len(rest) == 400
    rest[:] = b"b" * 400
    sink.advance(400)
    assert sink.complete and budget.held == 0
    assert bytes(sink.view) == b"a" * 600 + b"b" * 400
    block = sink.take()
    sink.release()
    assert arena.in_use() == 1          # the route took it: the request frees it
    arena.free(block.seg, block.offset)
    assert arena.in_use() == 0


def test_a_released_sink_frees_its_block_once_and_drops_what_still_arrives(arena):
    budget = SinkBudget()
    assert budget.take(5000)
    sink = BodySink(arena, budget, 5000, header_len=0)
    sink.write(b"x" * 1000)
    sink.release()
    assert arena.in_use() == 0 and budget.held == 0
    other = arena.alloc(5000)           # the freed block's place, now another request's
    other.view[:] = b"o" * 5000
    sink.write(b"y" * 1000)
    scratch = sink.rest()
    assert len(scratch) == 3000
    scratch[:] = b"z" * 3000
    sink.advance(3000)
    sink.release()
    assert sink.complete and budget.held == 0
    assert bytes(other.view) == b"o" * 5000 and arena.in_use() == 1


def test_the_budget_caps_bodies_still_arriving():
    budget = SinkBudget(limit=10_000)
    assert budget.take(6000) and not budget.take(6000) and budget.take(4000)
    budget.give(6000)
    assert budget.take(6000) and budget.held == 10_000
