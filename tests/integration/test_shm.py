"""System (and, on this CPU-only host, CUDA) shared memory, driven exactly as a Triton user
drives it: `tritonclient.utils.shared_memory` regions, `register_system_shared_memory`,
`InferInput.set_shared_memory`, `InferRequestedOutput.set_shared_memory`, on HTTP and gRPC.

Every bounds, overflow, duplicate and unknown case is checked with its status and text, no
error ever names an internal segment, inputs are read where the client put them (the worker
maps the client's object; the frontends never do), outputs land in the client's region,
and regions unregistered under in-flight requests go only when the last one finishes.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, expect_error, serving, wait_for
from tritond.repository.devices import gpu_count

PROTOCOLS = ["http", "grpc"]

SUM_DIFF_MODEL = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (Triton's "simple").

    A request parameter "gate" (a directory) holds the call: it writes <gate>/started with
    the number of requests it got, then waits for <gate>/open.
    """

    def execute(self, requests):
        gates = [json.loads(r.parameters() or "{}").get("gate") for r in requests]
        gate = next((g for g in gates if g), None)
        if gate:
            with open(os.path.join(gate, "started.tmp"), "w") as f:
                f.write(str(len(requests)))
            os.rename(os.path.join(gate, "started.tmp"), os.path.join(gate, "started"))
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < deadline:
                time.sleep(0.01)
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
'''

SUM_DIFF_IO = '''
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''

LOCATE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def mapping_of(address):
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5] if len(parts) > 5 else ""
    return ""


class TritonPythonModel:
    """OUTPUT0 = INPUT0; WHERE = the file mapped at the address the model was handed."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            where = np.array([mapping_of(x.ctypes.data).encode()], dtype=object)
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("WHERE", where)]))
        return out
'''

LOCATE_CONFIG = '''
name: "locate"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


def write_model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


def build_repo(repo: Path) -> Path:
    write_model(repo, "simple", f'name: "simple"\nbackend: "python"\nmax_batch_size: 8\n{SUM_DIFF_IO}', SUM_DIFF_MODEL)
    # Sixteen requests form one batch (the queue delay is a ceiling, not a wait: a full batch goes at once).
    write_model(repo, "gated", 'name: "gated"\nbackend: "python"\nmax_batch_size: 16\n'
                f'dynamic_batching {{ max_queue_delay_microseconds: 30000000 }}\n{SUM_DIFF_IO}', SUM_DIFF_MODEL)
    write_model(repo, "locate", LOCATE_CONFIG, LOCATE_MODEL)
    write_onnx_sum_diff(repo / "simple_onnx")
    return repo


def write_onnx_sum_diff(path: Path) -> None:
    """The `simple` model in ONNX: its fixed output dims let ONNX Runtime write the outputs
    straight into the client's regions."""
    import onnx
    from onnx import TensorProto, helper
    io = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("INPUT0", "INPUT1")]
    out = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                               helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "sum_diff", io, out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))
    (path / "config.pbtxt").write_text('name: "simple_onnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                                       + SUM_DIFF_IO)


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    repo = build_repo(tmp_path_factory.mktemp("shm") / "models")
    with serving(TritondServer(repo, ["--allow-client-shm=true"], grpc=True)) as s:
        yield s


class Client:
    """One protocol's client plus the helpers whose shapes differ between protocols."""

    def __init__(self, protocol: str, server: TritondServer, concurrency: int = 1) -> None:
        self.protocol = protocol
        self.mod = httpclient if protocol == "http" else grpcclient
        url = server.http_url if protocol == "http" else server.grpc_url
        self.c = httpclient.InferenceServerClient(url, concurrency=concurrency) if protocol == "http" \
            else grpcclient.InferenceServerClient(url)

    def status(self, name: str = "") -> list[dict]:
        st = self.c.get_system_shared_memory_status(name)
        if self.protocol == "http":
            return sorted(st, key=lambda r: r["name"])
        return sorted(({"name": r.name, "key": r.key, "offset": int(r.offset), "byte_size": int(r.byte_size)}
                       for r in st.regions.values()), key=lambda r: r["name"])

    def cuda_status(self, name: str = "") -> list:
        st = self.c.get_cuda_shared_memory_status(name)
        return list(st) if self.protocol == "http" else list(st.regions.values())

    def output(self, name: str):
        return self.mod.InferRequestedOutput(name, binary_data=True) if self.protocol == "http" \
            else self.mod.InferRequestedOutput(name)

    def refuses(self, fn, http_status: int, text: str, grpc_code: str | None = None) -> str:
        """expect_error over this client's protocol, with no internal segment name in the message."""
        return expect_error(fn, http_status, text, protocol=self.protocol, grpc_code=grpc_code,
                            absent=("tritond.",)).message()


@pytest.fixture(params=PROTOCOLS)
def client(request, shm_server):
    c = Client(request.param, shm_server)
    yield c
    c.c.unregister_system_shared_memory()
    c.c.close()


class Regions:
    """Client regions under unique keys; every one is destroyed when the test ends."""

    def __init__(self) -> None:
        self.made: list = []

    def __call__(self, name: str, size: int):
        key = f"/{name}_{secrets.token_hex(4)}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.made.append(handle)
        return handle, key

    def destroy(self, handle) -> None:
        self.made.remove(handle)
        shm.destroy_shared_memory_region(handle)

    def close(self) -> None:
        keys = [h._shm_key.lstrip("/") for h in self.made]
        while self.made:
            self.destroy(self.made[-1])
        assert not [n for n in os.listdir("/dev/shm") if n in keys]


@pytest.fixture
def regions():
    r = Regions()
    yield r
    r.close()


IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.full((1, 16), 3, dtype=np.int32)


def four_regions(client: Client, regions, size: int = 64, register_offset: int = 0) -> dict:
    """Triton's test layout: input0/input1 filled, output0/output1 empty, all registered."""
    handles = {}
    for name in ("input0_data", "input1_data", "output0_data", "output1_data"):
        h, key = regions(name, size)
        client.c.register_system_shared_memory(name, key, 64, offset=register_offset)
        handles[name] = h
    shm.set_shared_memory_region(handles["input0_data"], [IN0], offset=register_offset)
    shm.set_shared_memory_region(handles["input1_data"], [IN1], offset=register_offset)
    return handles


def simple_request(client: Client, out_offset: int = 0, out_size: int = 64, in1=None,
                   out0_region: str = "output0_data"):
    inputs = [client.mod.InferInput("INPUT0", [1, 16], "INT32"), client.mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input0_data", 64)
    if in1 is None:
        inputs[1].set_shared_memory("input1_data", 64)
    else:
        inputs[1].set_data_from_numpy(in1)
    outputs = [client.output("OUTPUT0"), client.output("OUTPUT1")]
    outputs[0].set_shared_memory(out0_region, out_size, offset=out_offset)
    outputs[1].set_shared_memory("output1_data", 64)
    return inputs, outputs


def read_outputs(handles: dict, register_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return (shm.get_contents_as_numpy(handles["output0_data"], np.int32, [1, 16], offset=register_offset),
            shm.get_contents_as_numpy(handles["output1_data"], np.int32, [1, 16], offset=register_offset))


def maps_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------- registration and status

def test_register_status_unregister(client, regions):
    _, key = regions("region_a", 4096)
    client.c.register_system_shared_memory("region_a", key, 1024)
    client.c.register_system_shared_memory("region_b", key, 2048, offset=1024)
    assert client.status() == [
        {"name": "region_a", "key": key, "offset": 0, "byte_size": 1024},
        {"name": "region_b", "key": key, "offset": 1024, "byte_size": 2048},
    ]
    assert client.status("region_b") == [{"name": "region_b", "key": key, "offset": 1024, "byte_size": 2048}]
    client.refuses(lambda: client.c.get_system_shared_memory_status("nope"), 404,
                   "Unable to find system shared memory region: 'nope'")
    client.c.unregister_system_shared_memory("nope")                 # unknown: a no-op
    client.c.unregister_system_shared_memory("region_a")
    assert [r["name"] for r in client.status()] == ["region_b"]
    client.c.unregister_system_shared_memory()
    assert client.status() == []


def test_duplicate_name_already_exists(client, regions):
    _, key = regions("dup", 64)
    client.c.register_system_shared_memory("dup", key, 64)
    client.refuses(lambda: client.c.register_system_shared_memory("dup", key, 64), 400,
                   "shared memory region 'dup' already in manager", grpc_code="ALREADY_EXISTS")
    assert len(client.status()) == 1


@pytest.mark.parametrize("size,offset", [(65, 0), (64, 1), (1, 64), (0, 65)])
def test_register_beyond_the_object_is_invalid_args(client, regions, size, offset):
    _, key = regions("oob", 64)
    client.refuses(lambda: client.c.register_system_shared_memory("oob", key, size, offset=offset), 400,
                   "failed to register shared memory region 'oob': invalid args")
    assert client.status() == []


def test_register_unknown_key(client):
    client.refuses(lambda: client.c.register_system_shared_memory("r", "/no_such_region_here", 8), 500,
                   "Unable to open shared memory region: '/no_such_region_here'")


@pytest.mark.parametrize("key", ["/", "///"])
def test_register_slash_keys_refused(client, key):
    client.refuses(lambda: client.c.register_system_shared_memory("r", key, 8), 400,
                   f"cannot register shared memory region 'r' - invalid shm key '{key}'")


def test_internal_segments_cannot_be_registered(client, shm_server):
    client.c.infer("locate", [_fp32_input(client, np.ones(1 << 16, np.float32))])   # makes sure arenas exist
    live = shm_server.segments()
    assert live
    for name in (live[0], "/" + live[0], "//" + live[0], "///" + live[-1], "tritond.x", "/tritond."):
        message = client.refuses(lambda: client.c.register_system_shared_memory("r", name, 64), 400,
                                 "cannot register shared memory region 'r'")
        assert "reserved" in message
    assert client.status() == []


def test_python_backend_prefix_refused(client):
    key = "triton_python_backend_shm_region__my_key"
    client.refuses(lambda: client.c.register_system_shared_memory("n", key, 10000), 400,
                   f"cannot register shared memory region 'n' with key '{key}' as the key contains the "
                   f"reserved prefix 'triton_python_backend_shm_region_'")


# ---------------------------------------------------------------- inference

def test_infer_inputs_and_outputs_in_regions(client, regions):
    handles = four_regions(client, regions)
    inputs, outputs = simple_request(client)
    result = client.c.infer("simple", inputs, outputs=outputs)
    out0, out1 = read_outputs(handles)
    np.testing.assert_array_equal(out0, IN0 + IN1)
    np.testing.assert_array_equal(out1, IN0 - IN1)
    # The data went to the regions; the response only describes the outputs, as Triton's does.
    if client.protocol == "http":
        response = result.get_response()
        assert [o["name"] for o in response["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        assert all(o == {"name": o["name"], "datatype": "INT32", "shape": [1, 16]} for o in response["outputs"])
    else:
        response = result.get_response()
        assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
            ("OUTPUT0", "INT32", [1, 16]), ("OUTPUT1", "INT32", [1, 16])]
        assert all(len(b) == 0 for b in response.raw_output_contents)


@pytest.mark.parametrize("out0", ["output0_data", "input0_data"])
def test_an_onnx_model_computes_into_the_regions(client, regions, out0):
    """Into the output regions, or with OUTPUT0 over INPUT0's own bytes (then not in place:
    the model still reads them)."""
    handles = four_regions(client, regions)
    inputs, outputs = simple_request(client, out0_region=out0)
    client.c.infer("simple_onnx", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[out0], np.int32, [1, 16]), IN0 + IN1)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handles["output1_data"], np.int32, [1, 16]), IN0 - IN1)


def test_mixed_raw_and_shm_inputs(client, regions):
    handles = four_regions(client, regions)
    other = np.full((1, 16), 7, dtype=np.int32)
    inputs, outputs = simple_request(client, in1=other)
    client.c.infer("simple", inputs, outputs=outputs)
    out0, out1 = read_outputs(handles)
    np.testing.assert_array_equal(out0, IN0 + other)
    np.testing.assert_array_equal(out1, IN0 - other)


def test_outputs_at_offsets_of_one_region(client, regions):
    four_regions(client, regions)
    both, key = regions("both_outputs", 256)
    client.c.register_system_shared_memory("both", key, 192, offset=64)
    inputs = [client.mod.InferInput("INPUT0", [1, 16], "INT32"), client.mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input0_data", 64)
    inputs[1].set_shared_memory("input1_data", 64)
    outputs = [client.output("OUTPUT0"), client.output("OUTPUT1")]
    outputs[0].set_shared_memory("both", 64)
    outputs[1].set_shared_memory("both", 64, offset=128)
    client.c.infer("simple", inputs, outputs=outputs)
    raw = shm.get_contents_as_numpy(both, np.int32, [64])
    np.testing.assert_array_equal(raw[:16], 0)
    np.testing.assert_array_equal(raw[16:32], (IN0 + IN1)[0])
    np.testing.assert_array_equal(raw[32:48], 0)
    np.testing.assert_array_equal(raw[48:64], (IN0 - IN1)[0])


def test_large_register_offset(client, regions):
    """SECURITY-ANCHORS V6: a region registered one page before the end of a 1024-page object."""
    page = os.sysconf("SC_PAGE_SIZE")
    offset = page * 1023
    handles = four_regions(client, regions, size=page * 1024, register_offset=offset)
    inputs, outputs = simple_request(client)
    client.c.infer("simple", inputs, outputs=outputs)
    out0, out1 = read_outputs(handles, register_offset=offset)
    np.testing.assert_array_equal(out0, IN0 + IN1)
    np.testing.assert_array_equal(out1, IN0 - IN1)
    assert client.c.is_server_live()


def _fp32_input(client: Client, data: np.ndarray):
    i = client.mod.InferInput("INPUT0", list(data.shape), "FP32")
    i.set_data_from_numpy(data)
    return i


def test_inputs_are_read_where_the_client_put_them(client, regions, shm_server):
    """The model's input array lies in the worker's mapping of the client's own object, and no
    frontend ever maps the client's objects: nothing was copied on the way in or out."""
    data = np.arange(4096, dtype=np.float32)
    src, src_key = regions("locate_in", data.nbytes)
    dst, dst_key = regions("locate_out", data.nbytes)
    shm.set_shared_memory_region(src, [data])
    client.c.register_system_shared_memory("locate_in", src_key, data.nbytes)
    client.c.register_system_shared_memory("locate_out", dst_key, data.nbytes)
    inp = client.mod.InferInput("INPUT0", [4096], "FP32")
    inp.set_shared_memory("locate_in", data.nbytes)
    out = client.output("OUTPUT0")
    out.set_shared_memory("locate_out", data.nbytes)
    result = client.c.infer("locate", [inp], outputs=[out, client.output("WHERE")])
    assert result.as_numpy("WHERE")[0].decode() == "/dev/shm" + src_key
    np.testing.assert_array_equal(shm.get_contents_as_numpy(dst, np.float32, [4096]), data)
    for pid in shm_server.role_pids("tritond.frontend") + shm_server.role_pids("tritond.broker.main"):
        assert src_key not in maps_of(pid) and dst_key not in maps_of(pid)
    # A large input sent in the request body is read in place from the frontend's arena.
    result = client.c.infer("locate", [_fp32_input(client, np.ones(1 << 16, np.float32))])
    assert result.as_numpy("WHERE")[0].decode().startswith(f"/dev/shm/tritond.{shm_server.server_id}.")


# ---------------------------------------------------------------- bounds

def test_output_offset_beyond_region(client, regions):
    four_regions(client, regions)
    # HTTP can carry 2^64-32 (a negative offset if read as signed); gRPC's int64 cannot, so it tests 64.
    offset = 2**64 - 32 if client.protocol == "http" else 64
    inputs, outputs = simple_request(client, out_offset=offset)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   "Invalid offset for shared memory region: 'output0_data'")


def test_input_offset_beyond_region(client, regions):
    four_regions(client, regions)
    inputs, outputs = simple_request(client)
    inputs[0].set_shared_memory("input0_data", 64, offset=64)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   "Invalid offset for shared memory region: 'input0_data'")


def test_output_byte_size_beyond_region(client, regions):
    four_regions(client, regions)
    inputs, outputs = simple_request(client, out_offset=60, out_size=64)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   "Invalid offset + byte size for shared memory region: 'output0_data'")


def test_input_byte_size_beyond_region(client, regions):
    four_regions(client, regions)
    inputs, outputs = simple_request(client)
    inputs[1].set_shared_memory("input1_data", 64, offset=32)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   "Invalid offset + byte size for shared memory region: 'input1_data'")


def test_integer_overflow(client, regions):
    four_regions(client, regions)
    if client.protocol == "grpc":
        with pytest.raises(ValueError, match="Value out of range"):   # the client refuses it (int64_param)
            simple_request(client, out_offset=32, out_size=2**64 - 32)
        return
    inputs, outputs = simple_request(client, out_offset=32, out_size=2**64 - 32)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   f"Integer overflow detected: byte_size ({2**64 - 32}) + offset (32) exceeds maximum value "
                   f"({2**64 - 1}) for region 'output0_data'")


def test_unknown_region(client, regions):
    four_regions(client, regions)
    inputs, outputs = simple_request(client, out0_region="no_such_region")
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 404,
                   "Unable to find shared memory region: 'no_such_region'")


def test_output_region_too_small(client, regions):
    four_regions(client, regions)
    inputs, outputs = simple_request(client, out_size=32)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 500,
                   "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be "
                   "at least 64 bytes to hold the results")


def test_input_region_larger_than_the_tensor(client, regions):
    four_regions(client, regions)
    _, key = regions("input2_data", 128)
    client.c.register_system_shared_memory("input2_data", key, 128)
    inputs, outputs = simple_request(client)
    inputs[1].set_shared_memory("input2_data", 128)
    client.refuses(lambda: client.c.infer("simple", inputs, outputs=outputs), 400,
                   "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128")


# ---------------------------------------------------------------- unregister under load

def _fire(client: Client, model: str, count: int, params: dict, inputs, outputs):
    """Send `count` concurrent requests; returns a function that waits for all their outcomes."""
    if client.protocol == "http":
        pending = [client.c.async_infer(model, inputs, outputs=outputs, parameters=params) for _ in range(count)]

        def collect() -> list:
            out = []
            for p in pending:
                try:
                    out.append(p.get_result())
                except InferenceServerException as e:
                    out.append(e)
            return out
        return collect
    results: list = []
    for _ in range(count):
        client.c.async_infer(model, inputs, lambda result, error: results.append(error or result), outputs=outputs,
                             parameters=params)

    def collect() -> list:
        wait_for(lambda: len(results) == count, what=lambda: f"all answers, {len(results)} of {count} came",
                 sleep=gevent.sleep)
        return results
    return collect


@pytest.mark.parametrize("which", ["all", "one"])
def test_unregister_while_16_requests_in_flight(client, regions, shm_server, tmp_path, which):
    """SECURITY-ANCHORS V23: unregistering (one region or all) under 16 in-flight requests
    succeeds at once; the regions stay listed and mapped until the last request is done,
    every request completes with correct data, and only then do the workers unmap them."""
    handles = {}
    keys = {}
    for name in ("input0_data", "input1_data", "output0_data", "output1_data"):
        handles[name], keys[name] = regions(name, 64)
        client.c.register_system_shared_memory(name, keys[name], 64)
    shm.set_shared_memory_region(handles["input0_data"], [IN0])
    shm.set_shared_memory_region(handles["input1_data"], [IN1])
    inputs, outputs = simple_request(client)
    gate = tmp_path / "gate"
    gate.mkdir()
    loader = Client(client.protocol, shm_server, concurrency=16)     # its 16 connections stay busy
    collect = _fire(loader, "gated", 16, {"gate": str(gate)}, inputs, outputs)
    # gevent.sleep while waiting lets the HTTP client's request greenlets run
    wait_for(lambda: (gate / "started").exists(), what=lambda: "the gated batch to start\n" + shm_server.log,
             sleep=gevent.sleep)
    assert (gate / "started").read_text() == "16"
    worker = shm_server.worker_pids("gated")[0]
    assert keys["input0_data"] in maps_of(worker)

    if which == "all":
        client.c.unregister_system_shared_memory()
        gone = list(keys)
    else:
        client.c.unregister_system_shared_memory("output0_data")
        gone = ["output0_data"]
    # Still in use: listed as Triton lists them, and still mapped by the worker.
    assert [r["name"] for r in client.status()] == sorted(keys)
    assert all(keys[n] in maps_of(worker) for n in ("input0_data", "input1_data"))

    (gate / "open").touch()
    results = collect()
    loader.c.close()
    assert len(results) == 16
    assert not [r for r in results if isinstance(r, Exception)]
    out0, out1 = read_outputs(handles)
    np.testing.assert_array_equal(out0, IN0 + IN1)
    np.testing.assert_array_equal(out1, IN0 - IN1)

    wait_for(lambda: [r["name"] for r in client.status()] == sorted(set(keys) - set(gone)),
             what="the unregistered regions to leave the status", sleep=gevent.sleep)
    wait_for(lambda: not any(keys[n] in maps_of(worker) for n in gone),
             what=lambda: f"the worker to unmap the unregistered regions: {maps_of(worker)}", sleep=gevent.sleep)
    for name in gone:
        client.refuses(lambda: client.c.get_system_shared_memory_status(name), 404,
                       f"Unable to find system shared memory region: '{name}'")
    if which == "one":
        assert keys["input0_data"] in maps_of(worker)       # still registered, so still mapped


def test_region_destroyed_by_client_after_unregister(client, regions):
    """The client unlinks its object while the server still maps it: nothing breaks, and a new
    object under the same key is what a later registration sees."""
    handles = four_regions(client, regions)
    inputs, outputs = simple_request(client)
    client.c.infer("simple", inputs, outputs=outputs)
    client.c.unregister_system_shared_memory()
    key = handles["output0_data"]._shm_key
    regions.destroy(handles["output0_data"])
    fresh = shm.create_shared_memory_region("output0_data", key, 64)
    regions.made.append(fresh)
    for name in ("input0_data", "input1_data", "output1_data"):
        client.c.register_system_shared_memory(name, handles[name]._shm_key, 64)
    client.c.register_system_shared_memory("output0_data", key, 64)
    client.c.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(fresh, np.int32, [1, 16]), IN0 + IN1)


# ---------------------------------------------------------------- CUDA (no GPU here)

@pytest.mark.skipif(gpu_count() > 0, reason="this host has a GPU; tests/gpu covers CUDA shared memory")
def test_cuda_register_without_gpu(client, regions):
    handle = base64.b64encode(secrets.token_bytes(64))
    client.refuses(lambda: client.c.register_cuda_shared_memory("cuda_region", handle, 0, 64), 400,
                   "failed to register CUDA shared memory region: 'cuda_region', GPUs not supported")
    assert client.cuda_status() == []
    client.c.unregister_cuda_shared_memory("cuda_region")
    client.c.unregister_cuda_shared_memory()
    client.refuses(lambda: client.c.get_cuda_shared_memory_status("cuda_region"), 404,
                   "Unable to find cuda shared memory region: 'cuda_region'")
    _, key = regions("sys_region", 64)
    client.c.register_system_shared_memory("sys_region", key, 64)
    client.refuses(lambda: client.c.get_cuda_shared_memory_status("sys_region"), 404,
                   "The region named 'sys_region' is registered as system shared memory, not CUDA shared memory")
    client.c.unregister_cuda_shared_memory()                     # the system region stays
    assert [r["name"] for r in client.status()] == ["sys_region"]


def test_cuda_raw_handle_must_be_64_bytes(shm_server):
    import urllib.request
    for b64 in (base64.b64encode(b"A" * 48).decode(), "not base64!", ""):
        body = json.dumps({"raw_handle": {"b64": b64}, "device_id": 0, "byte_size": 64}).encode()
        req = urllib.request.Request(f"http://{shm_server.http_url}/v2/cudasharedmemory/region/r/register",
                                     data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400
        assert "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t" in json.load(e.value)["error"]


# ---------------------------------------------------------------- disabled by default

@pytest.fixture(scope="module")
def shm_off_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shm_off") / "models"
    write_model(repo, "simple", f'name: "simple"\nbackend: "python"\nmax_batch_size: 8\n{SUM_DIFF_IO}', SUM_DIFF_MODEL)
    with serving(TritondServer(repo, grpc=True)) as s:
        yield s


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_shm_off_by_default(shm_off_server, regions, protocol):
    c = Client(protocol, shm_off_server)
    text = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    _, key = regions("off", 64)
    c.refuses(lambda: c.c.register_system_shared_memory("off", key, 64), 501, text)
    c.refuses(lambda: c.c.unregister_system_shared_memory(), 501, text)
    c.refuses(lambda: c.c.register_cuda_shared_memory("off", base64.b64encode(bytes(64)), 0, 64), 501, text)
    assert c.status() == []
    assert c.cuda_status() == []
    c.c.close()
