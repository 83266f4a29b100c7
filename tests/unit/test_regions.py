"""The client region table: registration checks, Triton's error texts, bounds checks in
Triton's order, and deferred unregistration while requests use a region."""
from __future__ import annotations

import os
import secrets

import posix_ipc
import pytest

from tritond.shm.mapping import MappingError, SegmentMaps
from tritond.shm.regions import CUDA, SYSTEM, U64_MAX, RegionTable, cuda_location, parse_cuda_location
from tritond.wire.errors import TritonError

HANDLE = bytes(range(64))


@pytest.fixture
def key():
    name = f"/test_regions_{secrets.token_hex(6)}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=4096)
    shm.close_fd()
    yield name
    posix_ipc.unlink_shared_memory(name)


def error_of(fn, *args) -> tuple[str, str]:
    with pytest.raises(TritonError) as e:
        fn(*args)
    return e.value.code.value, e.value.message


def test_register_and_status(key):
    t = RegionTable()
    t.register("r", key, 1024, 2048)
    t.register("s", key.lstrip("/"), 0, 4096)
    assert [(r.name, r.key, r.offset, r.byte_size) for r in t.listed(None)] == [
        ("r", key, 1024, 2048), ("s", key.lstrip("/"), 0, 4096)]
    assert t.listed("s") == [t.regions["s"]]
    assert t.regions["s"].location == key
    assert error_of(t.listed, "nope") == ("NOT_FOUND", "Unable to find system shared memory region: 'nope'")


@pytest.mark.parametrize("offset", [0, 4096])
def test_a_zero_byte_region_is_refused_as_triton_does(key, offset):
    t = RegionTable()
    message = "failed to register shared memory region 'z': invalid args (byte_size must be greater than 0)"
    assert error_of(t.register, "z", key, offset, 0) == ("INVALID_ARG", message)
    assert error_of(t.register_cuda, "z", HANDLE, 0, 0) == ("INVALID_ARG", message)
    assert t.regions == {}


def test_duplicate_name_already_exists(key):
    t = RegionTable()
    t.register("r", key, 0, 8)
    assert error_of(t.register, "r", key, 0, 8) == ("ALREADY_EXISTS", "shared memory region 'r' already in manager")
    assert error_of(t.register_cuda, "r", HANDLE, 0, 8)[0] == "ALREADY_EXISTS"


@pytest.mark.parametrize("offset,size", [(0, 4097), (1, 4096), (4096, 1), (4097, 0), (U64_MAX, 1), (-1, 8),
                                         (0, U64_MAX + 1)])
def test_register_beyond_the_object_is_invalid_args(key, offset, size):
    t = RegionTable()
    assert error_of(t.register, "r", key, offset, size) == (
        "INVALID_ARG", "failed to register shared memory region 'r': invalid args")
    assert t.regions == {}


def test_register_unknown_key_is_internal():
    t = RegionTable()
    assert error_of(t.register, "r", "/no_such_key_here_xyz", 0, 8) == (
        "INTERNAL", "Unable to open shared memory region: '/no_such_key_here_xyz'")


@pytest.mark.parametrize("bad", ["", "/", "///", "a/b", 5, None])
def test_invalid_keys(bad):
    code, message = error_of(RegionTable().register, "r", bad, 0, 8)
    assert code == "INVALID_ARG"
    assert message.startswith("cannot register shared memory region 'r' - invalid shm key")


@pytest.mark.parametrize("internal", ["tritond.abc.f1.00", "/tritond.abc", "//tritond.x", "///tritond."])
def test_internal_keys_refused_without_echoing_them(internal):
    code, message = error_of(RegionTable().register, "r", internal, 0, 8)
    assert code == "INVALID_ARG"
    assert "tritond." not in message
    assert "reserved" in message


@pytest.mark.parametrize("key", ["triton_python_backend_shm_region_1", "//triton_python_backend_shm_region_x"])
def test_python_backend_prefix_refused_with_tritons_text(key):
    assert error_of(RegionTable().register, "n", key, 0, 8) == (
        "INVALID_ARG", f"cannot register shared memory region 'n' with key '{key}' as the key contains the "
                       f"reserved prefix 'triton_python_backend_shm_region_'")


def test_resolve_checks_in_tritons_order(key):
    t = RegionTable()
    t.register("r", key, 0, 64)
    assert t.resolve("r", 0, 64)[1] == 0
    assert t.resolve("r", 63, 1)[1] == 63
    assert error_of(t.resolve, "x", 0, 1) == ("NOT_FOUND", "Unable to find shared memory region: 'x'")
    assert error_of(t.resolve, "r", 64, 1) == ("INVALID_ARG", "Invalid offset for shared memory region: 'r'")
    # An offset past the region is reported as such even when offset+size also overflows.
    assert error_of(t.resolve, "r", 2**64 - 32, 64) == ("INVALID_ARG", "Invalid offset for shared memory region: 'r'")
    assert error_of(t.resolve, "r", 32, 2**64 - 32) == (
        "INVALID_ARG", f"Integer overflow detected: byte_size ({2**64 - 32}) + offset (32) exceeds maximum value "
                       f"({U64_MAX}) for region 'r'")
    assert error_of(t.resolve, "r", 60, 64) == (
        "INVALID_ARG", "Invalid offset + byte size for shared memory region: 'r'")


def test_nonzero_register_offset_is_applied_once(key):
    t = RegionTable()
    t.register("r", key, 4000, 96)
    region, absolute = t.resolve("r", 16, 80)
    assert absolute == 4016
    assert error_of(t.resolve, "r", 16, 81)[1] == "Invalid offset + byte size for shared memory region: 'r'"


def test_unregister_unknown_and_one_and_all(key):
    t = RegionTable()
    assert t.unregister("nope") == []
    t.register("a", key, 0, 8)
    t.register("b", key, 8, 8)
    assert t.unregister("a") == []            # "b" still maps the same key
    assert t.unregister(None) == [key]
    assert t.listed(None) == []


def test_unregister_while_in_use_is_deferred(key):
    t = RegionTable()
    t.register("r", key, 0, 64)
    region, _ = t.resolve("r", 0, 8)
    t.acquire(region)
    t.acquire(region)
    assert t.unregister(None) == []
    assert [r.name for r in t.listed(None)] == ["r"]   # listed until the last use ends, as Triton does
    assert error_of(t.register, "r", key, 0, 8)[0] == "ALREADY_EXISTS"
    assert t.release(region) == []
    assert t.release(region) == [key]
    assert t.listed(None) == []
    t.register("r", key, 0, 8)                          # the name is free again


def test_cuda_regions_share_the_name_space_but_not_status(key):
    t = RegionTable()
    t.register("sys", key, 0, 8)
    t.register_cuda("gpu", HANDLE, 1, 256)
    assert [(r.name, r.device_id, r.byte_size) for r in t.listed(None, CUDA)] == [("gpu", 1, 256)]
    assert [r.name for r in t.listed(None, SYSTEM)] == ["sys"]
    assert error_of(t.listed, "gpu", SYSTEM) == (
        "NOT_FOUND", "The region named 'gpu' is registered as CUDA shared memory, not system shared memory")
    assert error_of(t.listed, "sys", CUDA) == (
        "NOT_FOUND", "The region named 'sys' is registered as system shared memory, not CUDA shared memory")
    assert error_of(t.listed, "x", CUDA) == ("NOT_FOUND", "Unable to find cuda shared memory region: 'x'")
    assert parse_cuda_location(t.regions["gpu"].location) == (1, 256, HANDLE)
    assert t.resolve("gpu", 128, 128)[1] == 128
    assert t.unregister("gpu", SYSTEM) == []            # other kind: untouched
    assert t.unregister(None, SYSTEM) == [key]
    assert list(t.regions) == ["gpu"]
    assert t.unregister(None, CUDA) == [cuda_location(1, 256, HANDLE)]


@pytest.mark.parametrize("handle,device,size", [(b"x" * 63, 0, 8), (HANDLE, -1, 8), (HANDLE, 0, -1), ("s" * 64, 0, 8)])
def test_cuda_register_validates(handle, device, size):
    assert error_of(RegionTable().register_cuda, "g", handle, device, size) == (
        "INVALID_ARG", "failed to register shared memory region 'g': invalid args")


def test_mapping_rechecks_a_client_object_that_shrank(key):
    maps = SegmentMaps()
    try:
        assert len(maps.view(key, 0, 4096)) == 4096
        shm = posix_ipc.SharedMemory(key)
        try:
            os.ftruncate(shm.fd, 1024)
        finally:
            shm.close_fd()
        assert len(maps.view(key, 0, 1024)) == 1024
        with pytest.raises(MappingError):
            maps.view(key, 0, 4096)
    finally:
        maps.close()


def test_hard_link_to_an_internal_segment_is_refused():
    from tritond.shm.arena import Arena
    from tritond.shm.naming import new_server_id
    arena = Arena(new_server_id(), "t", segment_bytes=4096)
    block = arena.alloc(64)
    alias = f"test_regions_alias_{secrets.token_hex(4)}"
    os.link(f"/dev/shm{block.seg}", f"/dev/shm/{alias}")
    maps = SegmentMaps()
    try:
        code, message = error_of(RegionTable().register, "r", "/" + alias, 0, 64)
        assert code == "INVALID_ARG" and "reserved" in message and "tritond." not in message
        with pytest.raises(MappingError, match="reserved"):
            maps.view("/" + alias, 0, 64)
    finally:
        maps.close()
        os.unlink(f"/dev/shm/{alias}")
        arena.close()
