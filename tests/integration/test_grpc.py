"""The gRPC frontend through tritonclient.grpc (and .aio) on the example repository: every
RPC, the codes and texts clients match on, raw and typed-contents tensors, shared memory,
and ModelStreamInfer with a failing request in the middle."""
import asyncio
import base64
import os
import queue

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor
from tritonclient.utils import shared_memory as shm

from conftest import TritondServer, expect_error, serving

UNKNOWN_ID = "[request id: <id_unknown>] "


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(server.grpc_url)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel):
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def fails(code: str, fn, *args, **kwargs) -> str:
    """Call through tritonclient, expect gRPC status `code`, return the message."""
    return expect_error(lambda: fn(*args, **kwargs), protocol="grpc", grpc_code=code).message()


def stub_fails(code: grpc.StatusCode, fn, request, **kwargs) -> str:
    with pytest.raises(grpc.RpcError) as info:
        fn(request, **kwargs)
    assert info.value.code() == code, info.value.details()
    return info.value.details()


def fp32_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), "FP32")
    t.set_data_from_numpy(array)
    return t


def raw_request(model: str, name: str, datatype: str, shape: list, data: bytes) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype=datatype, shape=shape)
    req.raw_input_contents.append(data)
    return req


# ---------------------------------------------------------------- health, metadata, config

def test_health_and_server_metadata(client, channel):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp_onnx")
    assert client.is_model_ready("mlp_onnx", "1")
    assert not client.is_model_ready("mlp_onnx", "9")
    assert not client.is_model_ready("no_such_model")
    meta = client.get_server_metadata()
    assert meta.name == "triton" and meta.version == "2.73.0"
    assert list(meta.extensions)[:4] == ["classification", "sequence", "model_repository",
                                        "model_repository(unload_dependents)"]
    assert "system_shared_memory" in meta.extensions
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    assert check(b"") == b"\x08\x01"   # HealthCheckResponse{status: SERVING}


def test_model_metadata_and_config(client):
    meta = client.get_model_metadata("add_sub_onnx")
    assert meta.name == "add_sub_onnx" and list(meta.versions) == ["1"]
    assert meta.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])]
    assert [t.name for t in meta.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert client.get_model_metadata("string_upper", "1").platform == "python"

    cfg = client.get_model_config("mlp_onnx").config
    assert cfg.name == "mlp_onnx" and cfg.max_batch_size == 64
    assert list(cfg.input[0].dims) == [256]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 200
    auto = client.get_model_config("add_sub_onnx", as_json=True)["config"]
    assert [i["name"] for i in auto["input"]] == ["INPUT0", "INPUT1"]   # auto-completed config

    assert fails("INVALID_ARGUMENT", client.get_model_metadata, "nope") == \
        "Request for unknown model: 'nope' is not found"
    assert fails("NOT_FOUND", client.get_model_metadata, "mlp_onnx", "3") == "Request for unknown model: 'mlp_onnx' version 3 is not found"
    assert fails("INVALID_ARGUMENT", client.get_model_config, "mlp_onnx", "x").startswith(
        "failed to get model version from specified version string 'x'")
    assert fails("INVALID_ARGUMENT", client.get_model_config, "nope") == \
        "Request for unknown model: 'nope' is not found"


# ---------------------------------------------------------------- inference

def test_infer_raw_inputs_and_requested_outputs(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    result = client.infer("add_sub_onnx", [fp32_input("INPUT0", a), fp32_input("INPUT1", b)], request_id="r1")
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "add_sub_onnx" and response.model_version == "1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert len(response.raw_output_contents) == 2
    assert not any(o.HasField("contents") for o in response.outputs)

    only = client.infer("add_sub_onnx", [fp32_input("INPUT0", a), fp32_input("INPUT1", b)],
                        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)


def test_messages_beyond_grpcs_default_4mb_limit(client):
    x = np.arange(1_500_000, dtype=np.float32)   # 6 MB each way
    np.testing.assert_array_equal(client.infer("identity_fp32", [fp32_input("INPUT0", x)]).as_numpy("OUTPUT0"), x)


def test_mlp_matches_onnxruntime(client, example_repo):
    x = np.random.default_rng(7).standard_normal((3, 256)).astype(np.float32)
    served = client.infer("mlp_onnx", [fp32_input("INPUT0", x)]).as_numpy("OUTPUT0")
    session = ort.InferenceSession(str(example_repo / "mlp_onnx" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(["OUTPUT0"], {"INPUT0": x})[0]
    assert served.shape == (3, 256)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)


def test_infer_every_datatype_raw(client):
    arrays = {
        "FP32": np.array([1.5, -2.0, 3.25], np.float32),
        "INT64": np.array([1, -2, 1 << 40], np.int64),
        "BOOL": np.array([True, False, True]),
        "FP16": np.array([0.5, -1.25, 65504], np.float16),
        "BYTES": np.array([b"a", b"", "\u00e9t\u00e9".encode()], dtype=np.object_),
    }
    inputs = []
    for dt, arr in arrays.items():
        t = grpcclient.InferInput(f"INPUT_{dt}", [3], dt)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    result = client.infer("dtypes_py", inputs)
    for dt, arr in arrays.items():
        out = result.as_numpy(f"OUTPUT_{dt}")
        assert out.dtype == arr.dtype, dt
        np.testing.assert_array_equal(out, arr)


def test_a_large_request_with_several_raw_inputs(client):
    """Over 64 KiB the raw inputs are read in place from the received message: each still
    reaches its own input, BYTES included."""
    n = 20_000
    arrays = {
        "FP32": np.arange(n, dtype=np.float32),
        "INT64": np.arange(n, dtype=np.int64) << 33,
        "BOOL": np.arange(n) % 3 == 0,
        "FP16": np.arange(n, dtype=np.float16),
        "BYTES": np.array([str(i).encode() * (i % 5) for i in range(n)], dtype=np.object_),
    }
    inputs = []
    for dt, arr in arrays.items():
        t = grpcclient.InferInput(f"INPUT_{dt}", [n], dt)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    result = client.infer("dtypes_py", inputs)
    for dt, arr in arrays.items():
        np.testing.assert_array_equal(result.as_numpy(f"OUTPUT_{dt}"), arr)


def test_infer_typed_contents_with_a_shm_input(client, stub):
    """FP32/INT64/BOOL/BYTES in `contents`; FP16 has no contents field, so it comes from a
    system shared-memory region (raw_input_contents may not be mixed with contents)."""
    fp16 = np.array([1.5, -2.25, 3.0], np.float16)
    key = f"/tritond_test_grpc_fp16_{os.getpid()}"
    handle = shm.create_shared_memory_region("grpc_fp16", key, fp16.nbytes)
    try:
        shm.set_shared_memory_region(handle, [fp16])
        client.register_system_shared_memory("grpc_fp16", key, fp16.nbytes)
        req = pb.ModelInferRequest(model_name="dtypes_py", id="typed")
        for name, dt, field, values in [
            ("INPUT_FP32", "FP32", "fp32_contents", [1.0, 2.5, -3.0]),
            ("INPUT_INT64", "INT64", "int64_contents", [1, -2, 1 << 40]),
            ("INPUT_BOOL", "BOOL", "bool_contents", [True, False, True]),
            ("INPUT_BYTES", "BYTES", "bytes_contents", [b"a", b"", b"xyz"]),
        ]:
            t = req.inputs.add(name=name, datatype=dt, shape=[3])
            getattr(t.contents, field).extend(values)
        t = req.inputs.add(name="INPUT_FP16", datatype="FP16", shape=[3])
        t.parameters["shared_memory_region"].string_param = "grpc_fp16"
        t.parameters["shared_memory_byte_size"].int64_param = fp16.nbytes
        resp = stub.ModelInfer(req)
        assert resp.id == "typed"
        got = {}
        for out, raw in zip(resp.outputs, resp.raw_output_contents):
            assert not out.HasField("contents")
            if out.datatype == "BYTES":
                got[out.name] = list(deserialize_bytes_tensor(raw))
            else:
                got[out.name] = np.frombuffer(raw, dtype={"FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_,
                                                          "FP16": np.float16}[out.datatype]).tolist()
        assert got["OUTPUT_FP32"] == [1.0, 2.5, -3.0]
        assert got["OUTPUT_INT64"] == [1, -2, 1 << 40]
        assert got["OUTPUT_BOOL"] == [True, False, True]
        assert got["OUTPUT_BYTES"] == [b"a", b"", b"xyz"]
        assert got["OUTPUT_FP16"] == fp16.tolist()
    finally:
        client.unregister_system_shared_memory("grpc_fp16")
        shm.destroy_shared_memory_region(handle)


def test_infer_errors_carry_tritons_codes_and_texts(client, stub):
    x = np.zeros(4, np.float32)
    assert fails("INVALID_ARGUMENT", client.infer, "nope", [fp32_input("INPUT0", x)]) == \
        "Request for unknown model: 'nope' is not found"
    assert fails("NOT_FOUND", client.infer, "identity_fp32", [fp32_input("INPUT0", x)], model_version="2") == \
        "Request for unknown model: 'identity_fp32' version 2 is not found"

    wrong = grpcclient.InferInput("INPUT0", [4], "INT32")
    wrong.set_data_from_numpy(np.zeros(4, np.int32))
    assert fails("INVALID_ARGUMENT", client.infer, "identity_fp32", [wrong]) == (
        UNKNOWN_ID + "inference input 'INPUT0' data-type is 'INT32', but model 'identity_fp32' expects 'FP32'")
    assert fails("INVALID_ARGUMENT", client.infer, "mlp_onnx",
                 [fp32_input("INPUT0", np.zeros((2, 100), np.float32))], request_id="s").startswith(
        "[request id: s] unexpected shape for input 'INPUT0' for model 'mlp_onnx'. Expected [-1,256], got [2,100].")
    assert fails("INVALID_ARGUMENT", client.infer, "mlp_onnx",
                 [fp32_input("INPUT0", np.zeros((65, 256), np.float32))]) == \
        UNKNOWN_ID + "inference request batch-size must be <= 64 for 'mlp_onnx'"
    assert fails("INVALID_ARGUMENT", client.infer, "add_sub_onnx",
                 [fp32_input("INPUT0", np.zeros((1, 16), np.float32))]).startswith(
        UNKNOWN_ID + "expected 2 inputs but got 1 inputs for model 'add_sub_onnx'")
    assert fails("INVALID_ARGUMENT", client.infer, "identity_fp32", [fp32_input("BOGUS", x)]) == \
        "unexpected inference input 'BOGUS' for model 'identity_fp32'"
    assert fails("INVALID_ARGUMENT", client.infer, "identity_fp32", [fp32_input("INPUT0", x)],
                 outputs=[grpcclient.InferRequestedOutput("NOPE")]) == \
        "unexpected inference output 'NOPE' for model 'identity_fp32'"

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    short = raw_request("identity_fp32", "INPUT0", "FP32", [4], b"\0" * 12)
    assert stub_fails(invalid, stub.ModelInfer, short) == \
        UNKNOWN_ID + "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. Expected 16, got 12"
    nodata = pb.ModelInferRequest(model_name="identity_fp32")
    nodata.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    assert stub_fails(invalid, stub.ModelInfer, nodata) == \
        "unable to find data for input tensor 'INPUT0' for model 'identity_fp32' in request."
    typed = pb.ModelInferRequest(model_name="identity_fp32")
    typed.inputs.add(name="INPUT0", datatype="FP32", shape=[2]).contents.int64_contents.extend([1, 2])
    assert stub_fails(invalid, stub.ModelInfer, typed) == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity_fp32' of type 'INT64', "
        "expected datatype 'FP32'")
    mixed = raw_request("add_sub_onnx", "INPUT0", "FP32", [1, 16], b"\0" * 64)
    mixed.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend([0.0] * 16)
    assert stub_fails(invalid, stub.ModelInfer, mixed) == \
        "contents field must not be specified when using raw_input_contents for 'INPUT1' for model 'add_sub_onnx'"

    good = raw_request("identity_fp32", "INPUT0", "FP32", [4], b"\0" * 16)
    for key, param, text in [
        ("priority", pb.InferParameter(string_param="high"),
         "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        ("priority", pb.InferParameter(int64_param=-1), "invalid value for 'priority', expected value >= 0."),
        ("sequence_id", pb.InferParameter(bool_param=True),
         "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        ("timeout", pb.InferParameter(uint64_param=5), "invalid value type for 'timeout' parameter, expected int64_param."),
        ("triton_secret", pb.InferParameter(bool_param=True),
         "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
         "with 'triton_' are allowed: triton_enable_empty_final_response"),
    ]:
        req = pb.ModelInferRequest()
        req.CopyFrom(good)
        req.parameters[key].CopyFrom(param)
        assert stub_fails(invalid, stub.ModelInfer, req) == text
    assert stub_fails(invalid, stub.ModelInfer, pb.ModelInferRequest(model_name="identity_fp32", model_version="-2")) \
        == "invalid model version specified '-2' , version should be an integral value > 0"
    # the valid request still works and accepts pass-through and Triton's own parameters
    good.parameters["note"].string_param = "kept"
    good.parameters["priority"].uint64_param = 0
    assert stub.ModelInfer(good).raw_output_contents[0] == b"\0" * 16


def test_classification_output(client):
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    plain = client.infer("mlp_onnx", [fp32_input("INPUT0", x)]).as_numpy("OUTPUT0")
    result = client.infer("mlp_onnx", [fp32_input("INPUT0", x)],
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    labels = result.as_numpy("OUTPUT0")
    assert labels.shape == (2, 3)
    top = [int(s.split(b":")[1]) for s in labels[0]]
    assert top == list(np.argsort(-plain[0], kind="stable")[:3])


# ---------------------------------------------------------------- streaming

def test_stream_keeps_going_after_a_bad_request(client):
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(5):
            if i == 2:
                bad = grpcclient.InferInput("INPUT0", [4], "INT32")
                bad.set_data_from_numpy(np.zeros(4, np.int32))
                client.async_stream_infer("identity_fp32", [bad], request_id=str(i))
            else:
                client.async_stream_infer("identity_fp32", [fp32_input("INPUT0", np.full(4, i, np.float32))],
                                          request_id=str(i))
        got = [results.get(timeout=60) for _ in range(5)]
    finally:
        client.stop_stream()
    errors = [e for r, e in got if e is not None]
    assert [e.message() for e in errors] == [
        "[request id: 2] inference input 'INPUT0' data-type is 'INT32', but model 'identity_fp32' expects 'FP32'"]
    answered = {r.get_response().id: r.as_numpy("OUTPUT0") for r, e in got if r is not None}
    assert sorted(answered) == ["0", "1", "3", "4"]
    for rid, out in answered.items():
        np.testing.assert_array_equal(out, np.full(4, int(rid), np.float32))


def test_stream_error_ids_and_grpc_error_mode(stub):
    good = raw_request("identity_fp32", "INPUT0", "FP32", [1], b"\0" * 4)
    good.id = "ok"
    bad = raw_request("no_such_model", "INPUT0", "FP32", [1], b"\0" * 4)
    bad.id = "bad"
    responses = list(stub.ModelStreamInfer(iter([bad, good])))
    by_id = {r.infer_response.id: r for r in responses}
    assert by_id["bad"].error_message == "Request for unknown model: 'no_such_model' is not found"
    assert by_id["ok"].error_message == "" and by_id["ok"].infer_response.model_name == "identity_fp32"
    # with triton_grpc_error the first error ends the stream with its status code
    call = stub.ModelStreamInfer(iter([bad]), metadata=(("triton_grpc_error", "true"),))
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ---------------------------------------------------------------- statistics, repository, settings

def test_statistics(client):
    x = np.zeros(4, np.float32)
    before = client.get_inference_statistics("identity_fp32").model_stats[0].inference_stats.success.count
    client.infer("identity_fp32", [fp32_input("INPUT0", x)])
    stats = client.get_inference_statistics("identity_fp32", "1").model_stats
    assert len(stats) == 1 and stats[0].name == "identity_fp32" and stats[0].version == "1"
    assert stats[0].inference_stats.success.count == before + 1
    assert stats[0].execution_count >= 1 and stats[0].last_inference > 0
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"mlp_onnx", "string_upper", "identity_fp32"} <= {s["name"] for s in everything}
    assert fails("INVALID_ARGUMENT", client.get_inference_statistics, "nope") == \
        "Request for unknown model: 'nope' is not found"


def test_repository_in_none_mode(client, stub):
    index = client.get_model_repository_index()
    assert {(m.name, m.version, m.state) for m in index.models} >= {("mlp_onnx", "1", "READY"),
                                                                   ("identity_fp32", "1", "READY")}
    text = "explicit model load / unload is not allowed if polling is enabled"
    assert fails("UNAVAILABLE", client.load_model, "identity_fp32") == text
    assert fails("UNAVAILABLE", client.unload_model, "identity_fp32") == text
    assert stub_fails(grpc.StatusCode.UNIMPLEMENTED, stub.RepositoryIndex,
                      pb.RepositoryIndexRequest(repository_name="other")) == \
        "'repository_name' specification is not supported"


def test_system_shared_memory(client):
    x = np.arange(8, dtype=np.float32)
    key_in, key_out = f"/tritond_test_grpc_in_{os.getpid()}", f"/tritond_test_grpc_out_{os.getpid()}"
    h_in = shm.create_shared_memory_region("grpc_in", key_in, x.nbytes)
    h_out = shm.create_shared_memory_region("grpc_out", key_out, x.nbytes)
    try:
        shm.set_shared_memory_region(h_in, [x])
        client.register_system_shared_memory("grpc_in", key_in, x.nbytes)
        client.register_system_shared_memory("grpc_out", key_out, x.nbytes)
        status = client.get_system_shared_memory_status()
        assert status.regions["grpc_in"].key == key_in and status.regions["grpc_in"].byte_size == x.nbytes
        assert set(client.get_system_shared_memory_status("grpc_out").regions) == {"grpc_out"}
        assert fails("ALREADY_EXISTS", client.register_system_shared_memory, "grpc_in", key_in, x.nbytes) == \
            "shared memory region 'grpc_in' already in manager"

        inp = grpcclient.InferInput("INPUT0", [8], "FP32")
        inp.set_shared_memory("grpc_in", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("grpc_out", x.nbytes)
        result = client.infer("identity_fp32", [inp], outputs=[out])
        assert result.get_response().raw_output_contents[0] == b""
        assert list(result.get_output("OUTPUT0").shape) == [8]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [8]), x)

        missing = grpcclient.InferInput("INPUT0", [8], "FP32")
        missing.set_shared_memory("not_registered", x.nbytes)
        assert fails("NOT_FOUND", client.infer, "identity_fp32", [missing]) == \
            "Unable to find shared memory region: 'not_registered'"
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
    assert not client.get_system_shared_memory_status().regions


def test_cuda_shared_memory_without_gpus(client):
    assert not client.get_cuda_shared_memory_status().regions
    handle = base64.b64encode(b"\0" * 64)
    assert fails("INVALID_ARGUMENT", client.register_cuda_shared_memory, "cuda0", handle, 0, 64) == \
        "failed to register CUDA shared memory region: 'cuda0', GPUs not supported"
    # a handle that is no cudaIpcMemHandle_t: Triton's words (L0_grpc's python_grpc_aio_test matches them)
    assert fails("INVALID_ARGUMENT", client.register_cuda_shared_memory, "", b"", 0, 0) == (
        "failed to register shared memory region '': invalid args ('raw_handle' must be a valid base64 encoded "
        "cudaIpcMemHandle_t)")
    client.unregister_cuda_shared_memory()


def test_log_and_trace_settings(client, stub):
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": True} and settings["log_format"] == {"string_param": "default"}
    updated = client.update_log_settings({"log_verbose_level": 0, "log_warning": True})
    assert updated.settings["log_verbose_level"].uint32_param == 0
    assert fails("UNIMPLEMENTED", client.update_log_settings, {"log_file": "/tmp/owned.log"}) == \
        "log file location can not be updated through network protocol"
    request = pb.LogSettingsRequest()
    request.settings["log_info"].string_param = "yes"
    assert stub_fails(grpc.StatusCode.INVALID_ARGUMENT, stub.LogSettings, request) == "expect boolean for 'log_info'"

    trace = client.get_trace_settings()
    assert list(trace.settings["trace_level"].value) == ["OFF"]
    assert fails("INVALID_ARGUMENT", client.update_trace_settings, settings={"trace_file": "/tmp/owned.json"}) == \
        "trace file location can not be updated through network protocol"
    model = client.update_trace_settings("identity_fp32", {"trace_rate": "10"})
    assert list(model.settings["trace_rate"].value) == ["10"]
    cleared = client.update_trace_settings("identity_fp32", {"trace_rate": None})
    assert list(cleared.settings["trace_rate"].value) == ["1000"]


# ---------------------------------------------------------------- asyncio client

def test_aio_client(server):
    async def main():
        c = aioclient.InferenceServerClient(server.grpc_url)
        try:
            assert await c.is_server_ready()
            assert (await c.get_model_metadata("identity_fp32")).platform == "python"
            x = np.arange(6, dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", [6], "FP32")
            inp.set_data_from_numpy(x)
            result = await c.infer("identity_fp32", [inp])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
            with pytest.raises(InferenceServerException) as info:
                await c.infer("nope", [inp])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"

            strings = grpcclient.InferInput("INPUT0", [2], "BYTES")
            strings.set_data_from_numpy(np.array([b"ab", b"cd"], dtype=np.object_))
            bad = grpcclient.InferInput("INPUT0", [2], "FP32")
            bad.set_data_from_numpy(np.zeros(2, np.float32))

            async def requests():
                for i, inputs in enumerate([[strings], [bad], [strings]]):
                    yield {"model_name": "string_upper", "inputs": inputs, "request_id": str(i)}

            got = [item async for item in c.stream_infer(requests())]
            assert len(got) == 3
            ok = sorted(r.get_response().id for r, e in got if e is None)
            assert ok == ["0", "2"]
            assert [list(r.as_numpy("OUTPUT0")) for r, e in got if e is None] == [[b"AB", b"CD"]] * 2
            assert [e.message() for r, e in got if e is not None] == [
                "[request id: 1] inference input 'INPUT0' data-type is 'FP32', but model 'string_upper' "
                "expects 'BYTES'"]
            stats = await c.get_inference_statistics("string_upper")
            assert stats.model_stats[0].inference_stats.success.count >= 2
        finally:
            await c.close()

    asyncio.run(main())



def test_response_delay_hook_holds_non_inference_calls_only(example_repo):
    """Triton's test hook TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC (L0_client_timeout's
    non-inference deadlines): every RPC but the inference ones waits, so a client deadline
    shorter than the delay expires, while ModelInfer answers at once."""
    env = {"TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": "3600"}
    with serving(TritondServer(example_repo, env=env)) as s:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        try:
            for call in (lambda: c.is_server_live(client_timeout=1), lambda: c.get_server_metadata(client_timeout=1),
                         lambda: c.get_model_config("identity_fp32", client_timeout=1)):
                with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
                    call()
            x = np.arange(6, dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", [6], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_array_equal(c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
        finally:
            c.close()
