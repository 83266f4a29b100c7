"""A /dev/shm too small for the arenas is reported at startup with the fix; the server still
serves what fits (small tensors travel inline)."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, serving


def can_mount_tmpfs() -> str:
    """'' when this process may mount a private tmpfs, else why not."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"cannot mount a private /dev/shm here: {r.stderr.strip()}"


class SmallShmServer(TritondServer):
    """tritond in its own mount namespace with a 40 MiB /dev/shm (a container's default is 64)."""

    def command(self) -> list[str]:
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs -o size=40m tmpfs /dev/shm && exec "$@"', "sh", *super().command()]


def test_small_dev_shm_is_reported_at_startup(example_repo, tmp_path):
    why = can_mount_tmpfs()
    if why:
        print(f"SKIP reason: {why}")
        pytest.skip(why)
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "identity_fp32", repo / "identity_fp32")
    with serving(SmallShmServer(repo)) as s:
        assert "/dev/shm is 40 MiB, less than the 96 MiB the shared-memory arenas of 2 frontend and " \
               "1 worker processes need" in s.log, s.log
        assert "--shm-size=1g" in s.log
        client = httpclient.InferenceServerClient(s.http_url)
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.arange(4, dtype=np.float32))
        r = client.infer("identity_fp32", [x])
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))
