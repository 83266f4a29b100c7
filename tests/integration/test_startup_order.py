"""Start-up that does not lie: no endpoint says live or ready before every enabled endpoint
accepts connections, so a client that waits for HTTP and then opens gRPC is never refused.

Run with every core of the host busy, and with the gRPC frontend made slow to open its port
(a sitecustomize that delays only that process), as it is when the host is loaded."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from conftest import TritondServer, build_example_repository, http_get, serving, wait_for

BUSY_S = 120        # each busy loop ends on its own after this, whatever happens to the test
GRPC_DELAY_S = 3.0

SLOW_GRPC = f"""
import time
with open("/proc/self/cmdline", "rb") as f:
    if b"tritond.frontend.grpc.server" in f.read():
        time.sleep({GRPC_DELAY_S})
"""


@pytest.fixture
def loaded_host():
    """One busy process per core for the test's duration, killed at its end."""
    loop = f"import time\nend = time.monotonic() + {BUSY_S}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 1)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def slow_grpc_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_GRPC)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_http_says_live_and_ready_only_once_grpc_accepts(tmp_path, loaded_host):
    repo = build_example_repository(tmp_path / "models", ("identity_fp32",))
    server = TritondServer(repo, env=slow_grpc_env(tmp_path)).launch()
    with serving(server):
        seen: set[str] = set()

        def both_seen() -> bool:
            """Each health answer's first 200 is followed at once by a gRPC call that must pass."""
            assert server.proc.poll() is None, server.log
            for path in ("live", "ready"):
                if path not in seen and http_get(f"http://{server.http_url}/v2/health/{path}", 1.0)[0] == 200:
                    seen.add(path)
                    client = grpcclient.InferenceServerClient(server.grpc_url)
                    try:
                        assert client.is_server_live(client_timeout=10), path
                    finally:
                        client.close()
            return len(seen) == 2

        wait_for(both_seen, timeout=120, what=lambda: f"the server to become live and ready:\n{server.log}",
                 every=0.01)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready()
        client.close()
