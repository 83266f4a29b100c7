"""gRPC frontend processes: two of them sharing the port, the restricted protocol header,
client shared memory switched off, and a graceful stop of one frontend with work in flight."""
import os
import signal

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, serving, socket_inodes, tcp_connections, wait_for

GRPC_MODULE = "tritond.frontend.grpc.server"

SLEEPER_CONFIG = """
name: "sleeper"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

SLEEPER_MODEL = '''
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Echoes INPUT0; touches the file named by parameter `marker`, then sleeps `sleep_ms`."""

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if params.get("marker"):
                open(params["marker"], "w").close()
            time.sleep(params.get("sleep_ms", 0) / 1000)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("grpc_repo")
    (repo / "sleeper" / "1").mkdir(parents=True)
    (repo / "sleeper" / "config.pbtxt").write_text(SLEEPER_CONFIG)
    (repo / "sleeper" / "1" / "model.py").write_text(SLEEPER_MODEL)
    with serving(TritondServer(repo, ["--grpc-workers", "2",
                                      "--grpc-restricted-protocol=model-repository,logging:admin=secret"])) as s:
        yield s


def local_channel(server) -> grpc.Channel:
    """A channel with its own TCP connection (not shared through the global subchannel pool)."""
    return grpc.insecure_channel(server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])


def serving_pids(server) -> dict[int, int]:
    """For each gRPC frontend pid, how many of this test process's connections it accepted."""
    port = server.grpc_port
    rows = tcp_connections()
    mine = socket_inodes(os.getpid())
    our_ports = {local for local, remote, inode in rows if remote == port and inode in mine}
    counts = {}
    for pid in server.role_pids(GRPC_MODULE):
        inodes = socket_inodes(pid)
        counts[pid] = sum(1 for local, remote, inode in rows
                          if local == port and remote in our_ports and inode in inodes)
    return counts


def test_both_frontend_processes_serve(server):
    assert len(server.role_pids(GRPC_MODULE)) == 2
    channels = [local_channel(server) for _ in range(16)]
    try:
        for ch in channels:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            assert stub.ServerReady(pb.ServerReadyRequest()).ready
            req = pb.ModelInferRequest(model_name="sleeper")
            req.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
            req.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
            assert np.frombuffer(stub.ModelInfer(req).raw_output_contents[0], np.float32).tolist() == [1, 2]
        counts = serving_pids(server)
        assert sum(counts.values()) == 16
        assert all(n > 0 for n in counts.values()), counts
    finally:
        for ch in channels:
            ch.close()


def test_restricted_protocol(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready()   # health is not restricted
        for call in (client.get_model_repository_index, client.get_log_settings):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert info.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin'"
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index(headers={"triton-grpc-protocol-admin": "wrong"})
        index = client.get_model_repository_index(headers={"triton-grpc-protocol-admin": "secret"})
        assert [m.name for m in index.models] == ["sleeper"]
        assert client.get_log_settings(headers={"triton-grpc-protocol-admin": "secret"}).settings["log_info"].bool_param
    finally:
        client.close()


def test_client_shared_memory_is_off_by_default(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert not client.get_system_shared_memory_status().regions
        for call, args in ((client.register_system_shared_memory, ("r", "/tritond_test_off", 64)),
                           (client.unregister_system_shared_memory, ()),
                           (client.register_cuda_shared_memory, ("c", b"AAAA", 0, 64))):
            with pytest.raises(InferenceServerException) as info:
                call(*args)
            assert info.value.status() == "StatusCode.UNIMPLEMENTED"
            assert info.value.message() == ("Client shared memory is disabled. Start the server with "
                                            "'--allow-client-shm=true' to enable.")
    finally:
        client.close()


def test_sigterm_refuses_new_rpcs_and_finishes_in_flight(server, tmp_path):
    channel = local_channel(server)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        assert stub.ServerLive(pb.ServerLiveRequest()).live
        [pid] = [p for p, n in serving_pids(server).items() if n]
        marker = tmp_path / "started"
        req = pb.ModelInferRequest(model_name="sleeper", id="slow")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[3])
        req.raw_input_contents.append(np.arange(3, dtype=np.float32).tobytes())
        req.parameters["marker"].string_param = str(marker)
        req.parameters["sleep_ms"].int64_param = 2000
        in_flight = stub.ModelInfer.future(req)
        wait_for(marker.exists, 60, "the slow request to reach the model", every=0.02)
        os.kill(pid, signal.SIGTERM)

        def refused_or_done() -> grpc.RpcError | str | None:
            if in_flight.done():
                return "the in-flight request finished"
            try:
                stub.ServerLive(pb.ServerLiveRequest())
            except grpc.RpcError as e:
                return e
            return None
        refused = wait_for(refused_or_done, 60, "an RPC to be refused or the in-flight one to finish", every=0.01)
        assert isinstance(refused, grpc.RpcError), "no RPC was refused while the frontend drained"
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.details() == "GRPC server is shutting down and has stopped accepting new requests."
        response = in_flight.result(timeout=60)
        assert response.id == "slow"
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [0, 1, 2]
    finally:
        channel.close()
    wait_for(lambda: len(server.role_pids(GRPC_MODULE)) == 2 and pid not in server.role_pids(GRPC_MODULE), 60,
             lambda: "the supervisor to replace the stopped frontend:\n" + server.log)
