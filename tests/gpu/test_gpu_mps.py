"""MPS: `tritond start --mps` runs two GPU instances of one model as clients of one private
MPS server, so their kernels share the GPU instead of time-slicing; the per-model SM share
reaches the workers; the daemon is gone after the server stops."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tritond.repository.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

if gpu_count() == 0:
    pytest.skip("no GPU: nvidia-smi lists none", allow_module_level=True)
if shutil.which("nvidia-cuda-mps-control") is None:
    pytest.skip("nvidia-cuda-mps-control is not on PATH", allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(f"torch {torch.__version__} cannot use the GPU", allow_module_level=True)

import tritonclient.http as httpclient  # noqa: E402

from conftest import TritondServer, serving  # noqa: E402

SIZE = 1024


class Busy(torch.nn.Module):
    """Enough matrix products to keep a GPU busy for a while per request."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(200):
            y = torch.tanh(y @ x)
        return y


CONFIG = f"""name: "busy"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {SIZE}, {SIZE} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {SIZE}, {SIZE} ] }} ]
instance_group [ {{ count: 2 kind: KIND_GPU gpus: [ 0 ] }} ]
parameters {{ key: "mps_active_thread_percentage" value {{ string_value: "50" }} }}
"""


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [i.split(b"=", 1) for i in f.read().split(b"\0") if b"=" in i]
    return {k.decode(): v.decode(errors="replace") for k, v in items}


def control(pipe_dir: str, command: str) -> str:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir)
    done = subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", env=env, capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("mps_repo")
    (repo / "busy" / "1").mkdir(parents=True)
    (repo / "busy" / "config.pbtxt").write_text(CONFIG)
    torch.jit.save(torch.jit.script(Busy()), str(repo / "busy" / "1" / "model.pt"))
    with serving(TritondServer(repo, ["--mps"]), timeout=300) as s:
        yield s
        pipe_dir = environ(s.worker_pids("busy")[0])["CUDA_MPS_PIPE_DIRECTORY"] if s.worker_pids("busy") else ""
    if pipe_dir:
        assert not Path(pipe_dir).exists()       # the run directory, with the daemon's pipes, is gone


def test_two_gpu_instances_are_clients_of_one_mps_server(server):
    pids = server.worker_pids("busy")
    assert len(pids) == 2
    envs = [environ(p) for p in pids]
    pipe_dir = envs[0]["CUDA_MPS_PIPE_DIRECTORY"]
    assert all(e["CUDA_MPS_PIPE_DIRECTORY"] == pipe_dir for e in envs)
    assert all(e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" for e in envs)
    assert all(e["CUDA_VISIBLE_DEVICES"] == "0" for e in envs)

    client = httpclient.InferenceServerClient(server.http_url, concurrency=2, network_timeout=300)
    x = (np.eye(SIZE, dtype=np.float32) * 0.5)
    pending, starts = [], []
    for _ in range(2):
        inp = httpclient.InferInput("INPUT__0", [SIZE, SIZE], "FP32")
        inp.set_data_from_numpy(x)
        starts.append(time.monotonic())
        pending.append(client.async_infer("busy", [inp]))
    outs = [p.get_result().as_numpy("OUTPUT__0") for p in pending]
    ends = time.monotonic()
    with torch.no_grad():
        expected = Busy()(torch.from_numpy(x)).numpy()
    for out in outs:
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    (stats,) = client.get_inference_statistics("busy")["model_stats"]
    assert stats["execution_count"] == 2
    print(f"two concurrent requests on two MPS clients took {ends - starts[0]:.3f} s")

    servers = control(pipe_dir, "get_server_list").split()
    assert servers, "the MPS control daemon reports no server"
    clients = control(pipe_dir, f"get_client_list {servers[0]}").split()
    assert len(clients) >= 2, f"expected both workers as MPS clients, got {clients}"
    client.close()
