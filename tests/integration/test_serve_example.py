"""scripts/serve-example.sh, the README's first command, run on a copy of the checkout whose
set-up step and virtual environment are stand-ins: it installs and builds only when their
inputs changed (a fresh clone does both), and the server it starts lets an unmodified
tritonclient program use system shared memory, as the README says."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import shared_memory as shm

from conftest import ROOT, TritondServer, serving

START = "tritond start --model-repository build/model_repository --allow-client-shm=true"


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path, example_repo) -> Path:
    """The files the script reads, a set-up step that records its run and makes a `.venv` whose
    python copies the already built example repository instead of building it again, and whose
    tritond is the real one (or, with RECORD_ONLY set, only records its arguments)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("serve-example.sh", "up_to_date.py"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    for name in ("pyproject.toml", "setup.cfg"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "examples" / "model_repository", root / "examples" / "model_repository",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "examples" / "build_repository.py", root / "examples" / "build_repository.py")
    calls = root / "calls.log"
    python = (f'#!/bin/sh\necho "python $*" >> {calls}\n'
              f'if [ "$1" = examples/build_repository.py ]; then mkdir -p "$2" && cp -r {example_repo}/. "$2"; exit; fi\n'
              f'exec {sys.executable} "$@"\n')
    tritond = (f'#!/bin/sh\necho "tritond $*" >> {calls}\n'
               f'if [ -n "$RECORD_ONLY" ] && [ "$1" != --version ]; then exit 0; fi\n'
               f'exec {sys.executable} -m tritond.cli "$@"\n')
    _executable(root / "scripts" / "setup.sh",
                f'#!/bin/sh\necho setup >> {calls}\nmkdir -p .venv/bin\n'
                f"cat > .venv/bin/python <<'X'\n{python}X\ncat > .venv/bin/tritond <<'X'\n{tritond}X\n"
                "chmod +x .venv/bin/python .venv/bin/tritond\n")
    return root


def run(checkout: Path, *args: str) -> list[str]:
    """The script's steps in one run, as the stand-ins recorded them."""
    calls = checkout / "calls.log"
    calls.unlink(missing_ok=True)
    out = subprocess.run(["bash", str(checkout / "scripts" / "serve-example.sh"), *args], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, RECORD_ONLY="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    return calls.read_text().splitlines()


def test_installs_and_builds_only_when_their_inputs_changed(checkout):
    build = "python examples/build_repository.py build/model_repository"
    assert run(checkout, "--log-verbose=1") == ["setup", build, f"{START} --log-verbose=1"]
    assert run(checkout) == ["tritond --version", START]
    with open(checkout / "examples" / "model_repository" / "identity_fp32" / "config.pbtxt", "a") as f:
        f.write("# changed\n")
    assert run(checkout) == ["tritond --version", build, START]
    assert run(checkout) == ["tritond --version", START]
    with open(checkout / "setup.cfg", "a") as f:
        f.write("\n")
    assert run(checkout) == ["setup", START]
    shutil.rmtree(checkout / "build" / "model_repository")
    assert run(checkout) == ["tritond --version", build, START]
    (checkout / ".venv" / "bin" / "tritond").unlink()
    assert run(checkout)[0] == "setup"


class ServedExample(TritondServer):
    """The server as the script starts it, on free ports."""

    def __init__(self, checkout: Path) -> None:
        super().__init__(checkout / "build" / "model_repository")
        self.script = checkout / "scripts" / "serve-example.sh"

    def command(self) -> list[str]:
        return ["bash", str(self.script), "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                "--metrics-port", str(self.metrics_port)]


def test_a_tritonclient_program_using_system_shared_memory_works_against_it(checkout):
    with serving(ServedExample(checkout), timeout=180) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        data = np.arange(4, dtype=np.float32)
        key = f"/serve-example-{os.getpid()}"
        region = shm.create_shared_memory_region("example_io", key, 2 * data.nbytes)
        try:
            shm.set_shared_memory_region(region, [data])
            client.register_system_shared_memory("example_io", key, 2 * data.nbytes)
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_shared_memory("example_io", data.nbytes)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            out.set_shared_memory("example_io", data.nbytes, offset=data.nbytes)
            client.infer("identity_fp32", [inp], outputs=[out])
            result = shm.get_contents_as_numpy(region, np.float32, [4], offset=data.nbytes)
            assert result.tolist() == data.tolist()
            client.unregister_system_shared_memory("example_io")
        finally:
            shm.destroy_shared_memory_region(region)
            client.close()
