"""An ensemble of two GPU PyTorch models whose intermediate crosses between the workers by
CUDA IPC handle: the first keeps its output on the device (`cuda_ipc_outputs`), the runner
asks for it as device memory because a GPU step reads it, and the second opens it in place.
The evidence is the workers' own account (with --log-verbose): the producer exported the
tensor by handle and the consumer used it on the device. When the reading step runs on the
CPU, the same producer hands over host memory instead, and the client always gets host bytes
(or, for an output placed in its CUDA shared-memory region, a device-to-device copy there)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tritond.repository.devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

if gpu_count() == 0:
    pytest.skip("no GPU: nvidia-smi lists none", allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip(f"torch {torch.__version__} cannot use the GPU", allow_module_level=True)
pytest.importorskip("cuda.bindings.runtime", reason="cuda-python (cuda.bindings) is not installed")

import tritonclient.http as httpclient  # noqa: E402
import tritonclient.utils.cuda_shared_memory as cudashm  # noqa: E402

from conftest import TritondServer, serving  # noqa: E402

WIDTH = 1024


class Affine(torch.nn.Module):
    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


MODEL = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: {kind} {gpus} }} ]
{extra}
"""

ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "step_one" model_version: -1
     input_map {{ key: "INPUT__0" value: "IN" }} output_map {{ key: "OUTPUT__0" value: "mid" }} }},
  {{ model_name: "{second}" model_version: -1
     input_map {{ key: "INPUT__0" value: "mid" }} output_map {{ key: "OUTPUT__0" value: "OUT" }} }}
] }}
"""

KEEP_ON_DEVICE = 'parameters { key: "cuda_ipc_outputs" value { string_value: "true" } }'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_ipc_repo")
    models = {  # name: (scale, shift, kind, extra)
        "step_one": (2.0, 1.0, "KIND_GPU", KEEP_ON_DEVICE),
        "step_two": (1.0, 3.0, "KIND_GPU", KEEP_ON_DEVICE),
        "step_two_cpu": (1.0, 3.0, "KIND_CPU", ""),
    }
    for name, (scale, shift, kind, extra) in models.items():
        (repo / name / "1").mkdir(parents=True)
        torch.jit.save(torch.jit.script(Affine(scale, shift)), str(repo / name / "1" / "model.pt"))
        gpus = "gpus: [ 0 ]" if kind == "KIND_GPU" else ""
        (repo / name / "config.pbtxt").write_text(MODEL.format(name=name, width=WIDTH, kind=kind, gpus=gpus,
                                                               extra=extra))
    for name, second in (("chain_gpu", "step_two"), ("chain_to_cpu", "step_two_cpu")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, width=WIDTH, second=second))
    with serving(TritondServer(repo, ["--log-verbose", "1", "--allow-client-shm=true"]), timeout=300) as s:
        yield s


def worker_lines(log: str, model: str, text: str) -> list[str]:
    """Lines a worker of `model` logged that contain `text`."""
    return [line for line in log.splitlines() if re.search(rf"worker:{model}_\d+_\d+\[", line) and text in line]


EXPORTED = "output(s) exported by CUDA IPC handle"
OPENED_ON_DEVICE = "input(s) opened by CUDA IPC handle, used on the device"


def infer_all(client, model: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    pending = []
    for x in xs:
        inp = httpclient.InferInput("IN", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        pending.append(client.async_infer(model, [inp]))
    return [p.get_result().as_numpy("OUT") for p in pending]


def test_the_intermediate_crosses_by_cuda_ipc_only_between_gpu_steps(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((n, WIDTH)).astype(np.float32) for n in (1, 2, 3, 1, 4, 2, 1, 3)]

    # The reading step runs on the CPU: the producer hands over host memory.
    for x, out in zip(xs, infer_all(client, "chain_to_cpu", xs)):
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, x * 2 + 1 + 3, rtol=1e-6, atol=1e-6)
    log = server.log
    assert not worker_lines(log, "step_one", EXPORTED), log
    assert not worker_lines(log, "step_two_cpu", "opened by CUDA IPC handle"), log

    # Both steps on the GPU: the intermediate goes by handle, several requests batched together.
    for x, out in zip(xs, infer_all(client, "chain_gpu", xs)):
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, x * 2 + 1 + 3, rtol=1e-6, atol=1e-6)
    log = server.log
    assert worker_lines(log, "step_one", EXPORTED), log
    assert worker_lines(log, "step_two", OPENED_ON_DEVICE), log
    # OUT is the ensemble's answer: step_two keeps outputs on the device, yet never exports it.
    assert not worker_lines(log, "step_two", EXPORTED), log
    assert not worker_lines(log, "step_two", "copied to the host"), log
    client.close()


def test_the_producer_alone_answers_a_client_with_host_bytes(server):
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(2 * WIDTH, dtype=np.float32).reshape(2, WIDTH)
    inp = httpclient.InferInput("INPUT__0", [2, WIDTH], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer("step_one", [inp]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)
    client.close()


@pytest.mark.parametrize("model", ["step_one", "chain_gpu"])
def test_a_device_output_lands_in_a_client_cuda_region(server, model):
    """The output stays on the device and is copied device to device into the region."""
    client = httpclient.InferenceServerClient(server.http_url)
    names = ("INPUT__0", "OUTPUT__0") if model == "step_one" else ("IN", "OUT")
    x = np.random.default_rng(2).standard_normal((2, WIDTH)).astype(np.float32)
    region = cudashm.create_shared_memory_region("ipc_out", x.nbytes, 0)
    try:
        client.register_cuda_shared_memory("ipc_out", cudashm.get_raw_handle(region), 0, x.nbytes)
        inp = httpclient.InferInput(names[0], [2, WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        out = httpclient.InferRequestedOutput(names[1], binary_data=True)
        out.set_shared_memory("ipc_out", x.nbytes)
        client.infer(model, [inp], outputs=[out])
        expected = x * 2 + 1 if model == "step_one" else x * 2 + 1 + 3
        np.testing.assert_allclose(cudashm.get_contents_as_numpy(region, np.float32, [2, WIDTH]), expected,
                                   rtol=1e-6, atol=1e-6)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region)
        client.close()
