"""The container image (Containerfile) run with podman: non-root, ready, one inference, a clean
drain on `podman stop`, and the startup error for a /dev/shm that is too small.

Building the image takes minutes (about 5 from nothing, 2.5 with the Debian base made), so
this test does not build it: it runs when `bash scripts/build-image.sh` has made
localhost/tritond:latest (or $TRITOND_IMAGE), and says why it skips otherwise."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, free_port, http_get, wait_for

IMAGE = os.environ.get("TRITOND_IMAGE", "localhost/tritond:latest")


def skip(reason: str) -> None:
    print(f"SKIP reason: {reason}")
    pytest.skip(reason)


def podman_options() -> list[str]:
    """The options this host needs to run a container (scripts/podman-opts.sh), or skip."""
    if shutil.which("podman") is None:
        skip("podman is not installed (apt-get install podman debootstrap; then bash scripts/build-image.sh)")
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode != 0:
        skip(f"the image {IMAGE} is not built: bash scripts/build-image.sh builds it (about 5 minutes)")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "podman-opts.sh"), IMAGE], capture_output=True, text=True)
    if r.returncode != 0:
        skip(f"this machine cannot run containers: {r.stderr.strip()}")
    return r.stdout.split()


class Container:
    def __init__(self, repo: Path, shm: str | None) -> None:
        self.name = f"tritond-test-{secrets.token_hex(4)}"
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        argv = ["podman", "run", "-d", "--name", self.name, "--network", "host", *podman_options(),
                "-v", f"{repo}:/models:ro"]
        if shm:
            argv += ["--shm-size", shm]
        argv += [IMAGE, "--model-repository", "/models", "--http-port", str(self.http),
                 "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics)]
        subprocess.run(argv, check=True, capture_output=True, text=True)

    def state(self) -> dict:
        r = subprocess.run(["podman", "inspect", self.name], capture_output=True, text=True, check=True)
        return json.loads(r.stdout)[0]["State"]

    def logs(self) -> str:
        r = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True)
        return r.stdout + r.stderr      # info lines on stdout, warnings and errors on stderr

    def wait_ready(self, timeout: float = 120) -> None:
        def ready() -> bool:
            if http_get(f"http://127.0.0.1:{self.http}/v2/health/ready", 1.0)[0] == 200:
                return True
            assert self.state()["Running"], f"the container exited:\n{self.logs()}"
            return False
        wait_for(ready, timeout, lambda: f"the container to be ready:\n{self.logs()}", every=0.25)

    def stop(self) -> int:
        subprocess.run(["podman", "stop", "-t", "60", self.name], capture_output=True, check=True)
        return self.state()["ExitCode"]

    def remove(self) -> None:
        subprocess.run(["podman", "rm", "-f", self.name], capture_output=True)


def readable_repo(example_repo: Path, dest: Path) -> Path:
    """identity_fp32, readable by the image's unprivileged user."""
    shutil.copytree(example_repo / "identity_fp32", dest / "identity_fp32")
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def test_image_serves_as_non_root_and_drains_on_stop(example_repo, tmp_path):
    podman_options()
    repo = readable_repo(example_repo, tmp_path / "models")
    c = Container(repo, shm="256m")
    try:
        c.wait_ready()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{c.http}")
        x = httpclient.InferInput("INPUT0", [3], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        np.testing.assert_array_equal(client.infer("identity_fp32", [x]).as_numpy("OUTPUT0"), [1, 2, 3])
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics}/metrics", timeout=5) as r:
            assert 'nv_inference_pending_request_count{model="identity_fp32",version="1"} 0' in r.read().decode()
        uid = subprocess.run(["podman", "exec", c.name, "id", "-u"], capture_output=True, text=True).stdout.strip()
        assert uid == "10001"
        assert "/dev/shm is" not in c.logs()           # 256 MiB is enough: no warning
        assert c.stop() == 0, c.logs()
        assert "Waiting for in-flight requests to complete." in c.logs() and "exit 0" in c.logs()
    finally:
        c.remove()


def test_image_reports_a_small_dev_shm(example_repo, tmp_path):
    podman_options()
    repo = readable_repo(example_repo, tmp_path / "models")
    c = Container(repo, shm=None)                     # podman's default: 64 MiB
    try:
        c.wait_ready()
        [line] = [ln for ln in c.logs().splitlines() if "/dev/shm is" in ln]
        assert re.search(r" E tritond\[1\] /dev/shm is 6\d MiB, less than the 96 MiB", line), line
        assert "--shm-size=1g" in line
        assert c.stop() == 0, c.logs()
    finally:
        c.remove()
