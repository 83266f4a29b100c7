"""CUDA shared memory end to end, as a Triton user drives it: regions made with
`tritonclient.utils.cuda_shared_memory`, registered by raw IPC handle over HTTP and gRPC,
used for inputs and outputs, bounds-checked, unregistered. The worker opens each handle with
`cudaIpcOpenMemHandle` on the region's device; the CPU backend's tensors are copied
device->host and host->device once (cudaMemcpy). Skips with the reason on a host without a
usable GPU or without cuda-python."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import TritondServer, expect_error, serving
from tritond.repository.devices import gpu_count

pytestmark = pytest.mark.gpu

if gpu_count() == 0:
    pytest.skip("no GPU: nvidia-smi lists none", allow_module_level=True)
cudart = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python (cuda.bindings) is not installed")
_err, _count = cudart.cudaGetDeviceCount()
if _err != cudart.cudaError_t.cudaSuccess or _count < 1:
    pytest.skip(f"cuda-python cannot use the GPU: {getattr(_err, 'name', _err)}", allow_module_level=True)

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.utils.cuda_shared_memory as cudashm  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402

SIMPLE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
'''

CONFIG = '''
name: "simple"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.full((1, 16), 3, dtype=np.int32)
NAMES = ("input0_data", "input1_data", "output0_data", "output1_data")
INTERNAL = ("tritond.",)        # no error message names a segment of the server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cuda_shm") / "models"
    (repo / "simple" / "1").mkdir(parents=True)
    (repo / "simple" / "config.pbtxt").write_text(CONFIG)
    (repo / "simple" / "1" / "model.py").write_text(SIMPLE)
    with serving(TritondServer(repo, ["--allow-client-shm=true"], grpc=True)) as s:
        yield s


@pytest.fixture(params=["http", "grpc"])
def proto(request, server):
    mod = httpclient if request.param == "http" else grpcclient
    url = server.http_url if request.param == "http" else server.grpc_url
    client = mod.InferenceServerClient(url)
    handles: list = []
    yield request.param, mod, client, handles
    client.unregister_cuda_shared_memory()
    client.unregister_system_shared_memory()
    for h in handles:
        cudashm.destroy_shared_memory_region(h)
    client.close()


def cuda_regions(client, handles, size=64, registered=64) -> dict:
    made = {}
    for name in NAMES:
        h = cudashm.create_shared_memory_region(name, size, 0)
        handles.append(h)
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(h), 0, registered)
        made[name] = h
    cudashm.set_shared_memory_region(made["input0_data"], [IN0])
    cudashm.set_shared_memory_region(made["input1_data"], [IN1])
    return made


def request(mod, protocol, out_offset=0, out_size=64):
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input0_data", 64)
    inputs[1].set_shared_memory("input1_data", 64)
    outputs = [mod.InferRequestedOutput(n, binary_data=True) if protocol == "http" else mod.InferRequestedOutput(n)
               for n in ("OUTPUT0", "OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", out_size, offset=out_offset)
    outputs[1].set_shared_memory("output1_data", 64)
    return inputs, outputs


def cuda_status(protocol, client, name=""):
    st = client.get_cuda_shared_memory_status(name)
    if protocol == "http":
        return sorted((r["name"], int(r["device_id"]), int(r["byte_size"])) for r in st)
    return sorted((r.name, int(r.device_id), int(r.byte_size)) for r in st.regions.values())


def test_register_status_infer_unregister(proto):
    protocol, mod, client, handles = proto
    made = cuda_regions(client, handles)
    assert cuda_status(protocol, client) == sorted((n, 0, 64) for n in NAMES)
    expect_error(lambda: client.register_cuda_shared_memory(
        "input0_data", cudashm.get_raw_handle(made["input0_data"]), 0, 64), 400,
        "shared memory region 'input0_data' already in manager", grpc_code="ALREADY_EXISTS",
        protocol=protocol, absent=INTERNAL)
    inputs, outputs = request(mod, protocol)
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(made["output0_data"], np.int32, [1, 16]), IN0 + IN1)
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(made["output1_data"], np.int32, [1, 16]), IN0 - IN1)
    # Again, with fresh inputs: the worker reuses the handles it opened.
    cudashm.set_shared_memory_region(made["input1_data"], [IN1 * 2])
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(made["output0_data"], np.int32, [1, 16]),
                                  IN0 + IN1 * 2)
    client.unregister_cuda_shared_memory("output1_data")
    assert [r[0] for r in cuda_status(protocol, client)] == ["input0_data", "input1_data", "output0_data"]
    client.unregister_cuda_shared_memory()
    assert cuda_status(protocol, client) == []
    expect_error(lambda: client.get_cuda_shared_memory_status("input0_data"), 404,
                 "Unable to find cuda shared memory region: 'input0_data'", protocol=protocol, absent=INTERNAL)


def test_cuda_and_system_regions_together(proto):
    protocol, mod, client, handles = proto
    made = cuda_regions(client, handles)
    key = "/cuda_test_sys_out"
    sys_out = shm.create_shared_memory_region("sys_out", key, 64)
    try:
        client.register_system_shared_memory("sys_out", key, 64)
        inputs, outputs = request(mod, protocol)
        outputs[1].set_shared_memory("sys_out", 64)
        client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(sys_out, np.int32, [1, 16]), IN0 - IN1)
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(made["output0_data"], np.int32, [1, 16]),
                                      IN0 + IN1)
        expect_error(lambda: client.get_cuda_shared_memory_status("sys_out"), 404,
                     "The region named 'sys_out' is registered as system shared memory, not CUDA shared memory",
                     protocol=protocol, absent=INTERNAL)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(sys_out)


def test_bounds(proto):
    protocol, mod, client, handles = proto
    cuda_regions(client, handles)
    inputs, outputs = request(mod, protocol, out_offset=64)
    expect_error(lambda: client.infer("simple", inputs, outputs=outputs), 400,
                 "Invalid offset for shared memory region: 'output0_data'", protocol=protocol, absent=INTERNAL)
    inputs, outputs = request(mod, protocol, out_offset=32, out_size=64)
    expect_error(lambda: client.infer("simple", inputs, outputs=outputs), 400,
                 "Invalid offset + byte size for shared memory region: 'output0_data'",
                 protocol=protocol, absent=INTERNAL)
    inputs, outputs = request(mod, protocol, out_size=32)
    expect_error(lambda: client.infer("simple", inputs, outputs=outputs), 500,
                 "should be at least 64 bytes to hold the results", protocol=protocol, absent=INTERNAL)


def test_bad_device_and_oversized_registration(proto):
    protocol, mod, client, handles = proto
    h = cudashm.create_shared_memory_region("small", 64, 0)
    handles.append(h)
    expect_error(lambda: client.register_cuda_shared_memory("small", cudashm.get_raw_handle(h), 99, 64),
                 400, "failed to register shared memory region 'small': invalid args",
                 protocol=protocol, absent=INTERNAL)
    # The size is checked against the allocation when a worker opens the handle, at first use.
    for name in ("input0_data", "input1_data", "output0_data", "output1_data"):
        handles.append(cudashm.create_shared_memory_region(name, 64, 0))
    client.register_cuda_shared_memory("input0_data", cudashm.get_raw_handle(handles[-4]), 0, 1 << 30)
    for name, handle in zip(NAMES[1:], handles[-3:]):
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0, 64)
    inputs, outputs = request(mod, protocol)
    expect_error(lambda: client.infer("simple", inputs, outputs=outputs), 400,
                 "the registered byte size exceeds the CUDA allocation", protocol=protocol, absent=INTERNAL)
