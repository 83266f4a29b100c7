"""PyTorch on the GPU: a KIND_GPU instance pinned by CUDA_VISIBLE_DEVICES computes what the
module computes on the CPU, served by tritond and driven directly; outputs kept on the
device (`cuda_ipc_outputs`) still reach a client correctly."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tritond.repository.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

if gpu_count() == 0:
    pytest.skip("no GPU: nvidia-smi lists none", allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(f"torch {torch.__version__} cannot use the GPU (CPU-only build or driver mismatch)",
                allow_module_level=True)

import tritonclient.http as httpclient  # noqa: E402

from conftest import TritondServer, serving  # noqa: E402
from tritond.repository.view import model_view  # noqa: E402
from tritond.workers.backends import create  # noqa: E402
from tritond.workers.backends.base import InstanceInfo, WorkerRequest  # noqa: E402

WIDTH = 256


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, WIDTH)).eval()


CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
instance_group [ {{ count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
{extra}
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpu_torch") / "model.pt"
    torch.jit.save(torch.jit.trace(mlp(), torch.zeros(1, WIDTH)), str(path))
    return path


@pytest.fixture(scope="module")
def server(model_file, tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_repo")
    for name, extra in (("mlp_gpu", ""),
                        ("mlp_gpu_device_out", 'parameters { key: "cuda_ipc_outputs" value { string_value: "true" } }')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, width=WIDTH, extra=extra))
        shutil.copy(model_file, repo / name / "1" / "model.pt")
    with serving(TritondServer(repo)) as s:
        yield s


def expected(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return mlp()(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("model", ["mlp_gpu", "mlp_gpu_device_out"])
def test_served_on_the_gpu_matches_the_cpu_module(server, model):
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.random.default_rng(1).standard_normal((4, WIDTH)).astype(np.float32)
    inp = httpclient.InferInput("INPUT__0", [4, WIDTH], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, expected(x), rtol=1e-4, atol=1e-4)


def test_worker_is_pinned_to_its_gpu(server):
    (pid,) = server.worker_pids("mlp_gpu")
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    assert env[b"CUDA_VISIBLE_DEVICES"] == b"0"


def test_backend_keeps_outputs_on_the_device(model_file, tmp_path):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    shutil.copy(model_file, version / "model.pt")
    config = {"name": "m", "platform": "pytorch_libtorch", "backend": "pytorch", "max_batch_size": 8,
              "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
              "parameters": {"cuda_ipc_outputs": {"string_value": "true"}}}
    info = InstanceInfo("m", 1, str(tmp_path / "m"), str(version), "m_0_0", kind="GPU")
    backend = create(config, model_view(config), info)
    backend.load()
    assert next(backend.module.parameters()).is_cuda
    parts = [np.random.default_rng(i).standard_normal((n, WIDTH)).astype(np.float32) for i, n in enumerate((1, 3))]
    responses = backend.execute([WorkerRequest({"INPUT__0": p}, []) for p in parts])
    for p, r in zip(parts, responses):
        out = r.outputs["OUTPUT__0"]
        assert hasattr(out, "__cuda_array_interface__") and out.shape == (len(p), WIDTH)
        np.testing.assert_allclose(np.asarray(out), expected(p), rtol=1e-4, atol=1e-4)
    backend.close()
