"""PyTorch models served by tritond on the CPU, checked against calling the module directly;
GPU-only models on a host without a GPU fail alone, with their reason, and `--mps` refuses
to start without MPS."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from tritonclient.utils import shared_memory as shm

from conftest import TritondServer, expect_error, serving, wait_for
from tritond.repository.devices import gpu_count

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HAS_GPU = gpu_count() > 0
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
MLP_WIDTH = 256


class AddSub(torch.nn.Module):
    def forward(self, left: torch.Tensor, right: torch.Tensor):
        return left + right, left - right


class Picky(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        if bool(x.sum() < 0):
            raise ValueError("negative input")
        return x


class Doubler2x2(torch.nn.Module):
    """Doubles a batch of 2x2 matrices, and refuses any other shape."""

    def forward(self, x: torch.Tensor):
        if x.dim() != 3:
            raise ValueError("expected a batch of 2x2 matrices")
        return x * 2


def config(name: str, body: str) -> str:
    return f'name: "{name}"\n{body}'


IO_ADD_SUB = """
input [ { name: "right" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "left" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_model(repo: Path, name: str, text: str, files: dict[str, Path | bytes]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config(name, text))
    for filename, source in files.items():
        target = repo / name / "1" / filename
        if isinstance(source, Path):
            shutil.copy(source, target)
        else:
            target.write_bytes(source)


@pytest.fixture(scope="module")
def repo(example_repo, tmp_path_factory) -> Path:
    if not (example_repo / "mlp_torch").is_dir():
        pytest.skip("the example repository has no mlp_torch (torch was not importable when it was built)")
    repo = tmp_path_factory.mktemp("torch") / "models"
    repo.mkdir()
    shutil.copytree(example_repo / "mlp_torch", repo / "mlp_torch")
    mlp_pt = repo / "mlp_torch" / "1" / "model.pt"
    write_model(repo, "mlp_torch_batched", """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }
""", {"model.pt": mlp_pt})
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(AddSub(), (torch.zeros(2, 4), torch.zeros(2, 4)),
                                  dynamic_shapes=({0: batch}, {0: batch}))
    pt2 = repo.parent / "add_sub.pt2"
    torch.export.save(program, str(pt2))
    write_model(repo, "add_sub_pt2", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                'default_model_filename: "model.pt2"\n' + IO_ADD_SUB, {"model.pt2": pt2})
    write_model(repo, "mlp_torch_gpu", """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]
""", {"model.pt": mlp_pt})
    picky = repo.parent / "picky.pt"
    torch.jit.save(torch.jit.script(Picky()), str(picky))
    write_model(repo, "picky", """
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", {"model.pt": picky})
    doubler = repo.parent / "doubler.pt"
    torch.jit.save(torch.jit.script(Doubler2x2()), str(doubler))
    write_model(repo, "reshaped", """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
""", {"model.pt": doubler})
    write_model(repo, "plan_model", """
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
""", {"model.plan": b"not an engine"})
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with serving(TritondServer(repo, ["--exit-on-error=false", "--strict-readiness=false", "--allow-client-shm=true"]),
                 wait="live") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, concurrency=8, network_timeout=120)
    yield c
    c.close()


def infer_mlp(client, model: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT__0")


def reference(repo: Path, x: np.ndarray) -> np.ndarray:
    module = torch.jit.load(str(repo / "mlp_torch" / "1" / "model.pt"))
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def test_mlp_matches_the_module_called_directly(server, client, repo):
    x = np.random.default_rng(0).standard_normal((3, MLP_WIDTH)).astype(np.float32)
    out = infer_mlp(client, "mlp_torch", x)
    assert out.shape == (3, MLP_WIDTH) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(repo, x), rtol=1e-5, atol=1e-5)


def test_dynamic_batching_runs_one_execution(server, client, repo):
    xs = [np.random.default_rng(i).standard_normal((1, MLP_WIDTH)).astype(np.float32) for i in range(4)]
    pending = []
    for x in xs:
        inp = httpclient.InferInput("INPUT__0", [1, MLP_WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        pending.append(client.async_infer("mlp_torch_batched", [inp]))
    expected = reference(repo, np.concatenate(xs))
    for i, p in enumerate(pending):
        np.testing.assert_allclose(p.get_result().as_numpy("OUTPUT__0"), expected[i:i + 1], rtol=1e-5, atol=1e-5)
    (stats,) = client.get_inference_statistics("mlp_torch_batched")["model_stats"]
    assert stats["inference_count"] == 4
    assert stats["execution_count"] == 1      # the preferred batch of 4 ran as one execution


def test_exported_program_binds_inputs_by_name(server, client):
    left = np.arange(8, dtype=np.float32).reshape(2, 4)
    right = np.full((2, 4), 0.5, dtype=np.float32)
    inputs = []
    for name, arr in (("left", left), ("right", right)):
        inp = httpclient.InferInput(name, [2, 4], "FP32")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("add_sub_pt2", inputs)
    np.testing.assert_allclose(result.as_numpy("SUM__0"), left + right)
    np.testing.assert_allclose(result.as_numpy("DIFF__1"), left - right)


def test_input_from_client_shared_memory(server, client, repo):
    x = np.random.default_rng(7).standard_normal((2, MLP_WIDTH)).astype(np.float32)
    handle = shm.create_shared_memory_region("torch_in", "/tritond_test_torch_in", x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("torch_in", "/tritond_test_torch_in", x.nbytes)
        inp = httpclient.InferInput("INPUT__0", [2, MLP_WIDTH], "FP32")
        inp.set_shared_memory("torch_in", x.nbytes)
        out = client.infer("mlp_torch", [inp]).as_numpy("OUTPUT__0")
        np.testing.assert_allclose(out, reference(repo, x), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [2, MLP_WIDTH]), x)
    finally:
        client.unregister_system_shared_memory("torch_in")
        shm.destroy_shared_memory_region(handle)


def test_config_reshape_applies_to_inputs_and_outputs(client):
    """As Triton: the model sees an input in its `reshape` shape and the client an output in its
    `dims` (qa/L0_infer_reshape)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = httpclient.InferInput("INPUT__0", [3, 4], "FP32")
    t.set_data_from_numpy(x)
    result = client.infer("reshaped", [t])
    assert result.get_output("OUTPUT__0")["shape"] == [3, 4]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2)


def index_entry(client, name: str) -> dict:
    return next(e for e in client.get_model_repository_index() if e["name"] == name)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path; this host has a GPU")
def test_an_execute_error_reaches_the_client_and_the_log_with_its_traceback(server, client):
    wait_for(lambda: client.is_model_ready("picky"), 120, "picky to load")
    inp = httpclient.InferInput("INPUT__0", [4], "FP32")
    inp.set_data_from_numpy(np.full(4, -1.0, dtype=np.float32))
    expect_error(lambda: client.infer("picky", [inp]), 500, "PyTorch execute failure")
    marker = "model 'picky' instance 'picky_0' failed to execute a batch of 1 request(s)"
    wait_for(lambda: marker in server.log, 30, "the error in the log")
    logged = server.log[server.log.index(marker):]
    assert "Traceback (most recent call last)" in logged and "negative input" in logged, logged


def test_gpu_instance_fails_only_its_model(server, client):
    entry = index_entry(client, "mlp_torch_gpu")
    assert entry["state"] == "UNAVAILABLE"
    assert "KIND_GPU but no GPUs are available" in entry["reason"]
    assert not client.is_model_ready("mlp_torch_gpu")
    with pytest.raises(InferenceServerException):
        infer_mlp(client, "mlp_torch_gpu", np.zeros((1, MLP_WIDTH), dtype=np.float32))
    assert client.is_model_ready("mlp_torch")


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the missing-library path; tensorrt is installed here")
def test_tensorrt_without_the_library_is_unavailable_with_the_reason(server, client):
    entry = index_entry(client, "plan_model")
    assert entry["state"] == "UNAVAILABLE"
    assert "needs the 'tensorrt' Python package" in entry["reason"]


@pytest.mark.skipif(HAS_GPU and shutil.which("nvidia-cuda-mps-control") is not None, reason="this host can run MPS")
def test_mps_refuses_to_start_without_mps(repo):
    s = TritondServer(repo, ["--mps"]).start(wait="exit", timeout=60)
    assert s.returncode == 1
    assert "--mps:" in s.log and ("nvidia-cuda-mps-control was not found" in s.log or "no GPU" in s.log)
    s.assert_clean()
