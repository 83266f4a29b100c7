"""The /dev/shm size check the supervisor runs at startup."""
from __future__ import annotations

from tritond.shm_space import shm_needed, shm_shortfall


def test_large_enough(tmp_path):
    assert shm_shortfall(2, 1, str(tmp_path)) == ""     # the test disk is far larger than 96 MiB


def test_too_small_names_sizes_and_the_fix(monkeypatch):
    class St:
        f_frsize = 4096
        f_blocks = f_bavail = (64 << 20) // 4096

    monkeypatch.setattr("os.statvfs", lambda p: St)
    why = shm_shortfall(2, 1, "/dev/shm")
    assert why.startswith("/dev/shm is 64 MiB, less than the 96 MiB")
    assert "--shm-size" in why and "medium: Memory" in why
    assert shm_needed(2, 1) == 96 << 20


def test_missing_path(tmp_path):
    assert "cannot read the size" in shm_shortfall(1, 1, str(tmp_path / "absent"))
