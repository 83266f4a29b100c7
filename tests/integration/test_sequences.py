"""The sequence batcher through tritonclient, as programs written for Triton use it: many
clients' sequences interleaved on both strategies over HTTP and gRPC, implicit state over 100
steps against a local reference, Triton's errors, slot exhaustion and the backlog, backlog and
idle timeouts, and a worker killed in the middle of a sequence."""
from __future__ import annotations

import concurrent.futures as futures
import os
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import metric, wait_for, worker_title


def value(x: float) -> np.ndarray:
    return np.array([[x]], np.float32)


def step(client, model: str, corrid, x: float, start: bool = False, end: bool = False, **kw) -> float:
    mod = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    inp = mod.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(value(x))
    result = client.infer(model, [inp], sequence_id=corrid, sequence_start=start, sequence_end=end, **kw)
    return float(result.as_numpy("OUTPUT")[0, 0])


def run_sequence(url: str, grpc: bool, model: str, corrid, steps: int, seed: int) -> list[tuple[float, float]]:
    """(server's running sum, local float32 reference) for each step of one sequence."""
    client = grpcclient.InferenceServerClient(url) if grpc else httpclient.InferenceServerClient(url)
    rng = np.random.default_rng(seed)
    total = np.float32(0)
    out = []
    for i in range(steps):
        x = float(np.float32(rng.uniform(-5, 5)))
        total = np.float32(total + np.float32(x))
        out.append((step(client, model, corrid, x, start=i == 0, end=i == steps - 1), float(total)))
    client.close()
    return out


@pytest.mark.parametrize("model", ["accumulator", "acc_oldest"])
def test_interleaved_sequences_from_many_clients(streaming_server, model):
    s = streaming_server
    jobs = []
    with futures.ThreadPoolExecutor(12) as pool:
        for i in range(12):
            grpc = i % 2 == 1
            corrid = f"{model}-{i}" if i % 3 == 0 else 1000 + i
            jobs.append(pool.submit(run_sequence, s.grpc_url if grpc else s.http_url, grpc, model, corrid, 15, i))
        for job in jobs:
            for got, want in job.result(timeout=120):
                assert got == want


def test_implicit_state_over_100_steps_equals_a_local_reference(streaming_server):
    for got, want in run_sequence(streaming_server.grpc_url, True, "accumulator", 77, 100, 42):
        assert got == want


def test_an_ensemble_passes_sequence_ids_and_flags_to_its_steps(streaming_server):
    client = httpclient.InferenceServerClient(streaming_server.http_url)
    sums = []
    for i, x in enumerate([1.0, 2.0, 3.5]):
        inp = httpclient.InferInput("X", [1, 1], "FP32")
        inp.set_data_from_numpy(value(x))
        out = client.infer("acc_ensemble", [inp], sequence_id="ens", sequence_start=i == 0, sequence_end=i == 2)
        sums.append(float(out.as_numpy("SUM")[0, 0]))
    assert sums == [1.0, 3.0, 6.5]
    client.close()


def test_triton_errors(streaming_server):
    s = streaming_server
    http = httpclient.InferenceServerClient(s.http_url)
    grpc = grpcclient.InferenceServerClient(s.grpc_url)
    start_msg = ("inference request for sequence 4242 to model 'accumulator' must specify the START flag on the "
                 "first request of the sequence")
    with pytest.raises(InferenceServerException) as info:
        step(http, "accumulator", 4242, 1.0)
    assert info.value.status() == "400" and start_msg in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        step(grpc, "accumulator", 4242, 1.0)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and info.value.message() == start_msg
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        step(http, "accumulator", 0, 1.0, start=True)
    two = httpclient.InferInput("INPUT", [2, 1], "FP32")
    two.set_data_from_numpy(np.ones((2, 1), np.float32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence"):
        http.infer("accumulator", [two], sequence_id=5, sequence_start=True)
    assert step(http, "accumulator", "ends", 2.0, start=True, end=True) == 2.0
    with pytest.raises(InferenceServerException, match="for sequence ends to model 'accumulator' must specify"):
        step(grpc, "accumulator", "ends", 1.0)
    with pytest.raises(InferenceServerException, match="cannot be longer than 128 characters"):
        step(http, "accumulator", "x" * 129, 1.0, start=True)
    http.close()
    grpc.close()


def test_a_full_slot_holds_new_sequences_in_the_backlog_until_one_ends(streaming_server):
    s = streaming_server
    client = httpclient.InferenceServerClient(s.http_url, concurrency=2)
    assert step(client, "acc_one", 1, 1.0, start=True) == 1.0
    waiting = client.async_infer("acc_one", [_input(5.0)], sequence_id=2, sequence_start=True)
    wait_for(lambda: metric(s, "nv_inference_pending_request_count", 0, model="acc_one") == 1, 30,
             "the new sequence's request to wait in the backlog")
    assert step(client, "acc_one", 1, 1.0) == 2.0          # the bound sequence goes on meanwhile
    assert step(client, "acc_one", 1, 1.0, end=True) == 3.0
    assert float(waiting.get_result().as_numpy("OUTPUT")[0, 0]) == 5.0
    assert step(client, "acc_one", 2, 1.0, end=True) == 6.0
    client.close()


def _input(x: float) -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(value(x))
    return inp


def test_a_backlogged_sequence_times_out_and_an_idle_one_is_forgotten(streaming_server):
    s = streaming_server
    client = httpclient.InferenceServerClient(s.http_url, concurrency=2)
    step(client, "acc_one", 11, 1.0, start=True)
    waiting = client.async_infer("acc_one", [_input(1.0)], sequence_id=12, sequence_start=True, timeout=100_000)
    with pytest.raises(InferenceServerException) as info:
        waiting.get_result()
    assert info.value.status() == "503"
    assert "timeout of the corresponding sequence has been expired" in info.value.message()
    time.sleep(0.8)                                       # acc_one forgets a sequence idle for 0.4 s
    with pytest.raises(InferenceServerException, match="for sequence 11 to model 'acc_one' must specify the START"):
        step(client, "acc_one", 11, 1.0)
    assert step(client, "acc_one", 13, 4.0, start=True, end=True) == 4.0
    client.close()


def test_a_direct_batch_counts_its_padding_slots_in_its_size(streaming_server):
    """As Triton's: a batch whose lower slots have nothing queued is padded, and the batch
    statistics count the padding (L0_sequence_batcher's backlog and queue-delay cases)."""
    client = grpcclient.InferenceServerClient(streaming_server.grpc_url)
    assert step(client, "acc_pad", 21, 1.0, start=True) == 1.0     # slot 0, alone: size 1
    assert step(client, "acc_pad", 22, 2.0, start=True) == 2.0     # slot 1 behind an empty slot 0: size 2
    assert step(client, "acc_pad", 22, 2.0, end=True) == 4.0
    assert step(client, "acc_pad", 21, 1.0, end=True) == 2.0       # slot 0 alone again
    stats = client.get_inference_statistics("acc_pad", as_json=True)["model_stats"][0]
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sizes == {1: 2, 2: 2}
    assert (int(stats["inference_count"]), int(stats["execution_count"])) == (4, 4)
    client.close()


def _worker_of(server, instance: str) -> int:
    for pid in server.worker_pids("acc_two"):
        if (worker_title(pid) or {}).get("instance") == instance:
            return pid
    raise AssertionError(f"no worker for {instance}")


def test_a_worker_killed_mid_sequence_loses_that_sequence_only(streaming_server):
    s = streaming_server
    client = grpcclient.InferenceServerClient(s.grpc_url)
    # acc_two has two instances with two slots each: sequences take slot 0 of each first.
    assert step(client, "acc_two", 1, 1.0, start=True) == 1.0      # acc_two_0_0
    assert step(client, "acc_two", 2, 10.0, start=True) == 10.0    # acc_two_0_1
    os.kill(_worker_of(s, "acc_two_0_0"), signal.SIGKILL)

    def lost_error() -> InferenceServerException | None:
        try:
            step(client, "acc_two", 1, 1.0)
        except InferenceServerException as e:
            if "was lost" in e.message():
                return e
        return None
    lost = wait_for(lost_error, 10, "sequence 1 to be answered as lost")
    assert lost.status() == "StatusCode.UNAVAILABLE"
    assert lost.message().startswith("sequence 1 of model 'acc_two' was lost: instance 'acc_two_0_0', which held its "
                                     "state, died (killed by signal 9 (SIGKILL))")
    assert step(client, "acc_two", 2, 1.0) == 11.0                  # the other sequence continues
    with pytest.raises(InferenceServerException, match="sequence 1 of model 'acc_two' was lost"):
        step(client, "acc_two", 1, 1.0, end=True)
    wait_for(lambda: client.is_model_ready("acc_two") and len(s.worker_pids("acc_two")) == 2, 20,
             "acc_two ready with two workers again")
    for corrid in (3, 4, 5):                                       # new sequences work, on both
        assert step(client, "acc_two", corrid, 2.0, start=True) == 2.0
        assert step(client, "acc_two", corrid, 2.0, end=True) == 4.0
    assert step(client, "acc_two", 1, 7.0, start=True, end=True) == 7.0
    assert step(client, "acc_two", 2, 1.0, end=True) == 12.0
    client.close()
