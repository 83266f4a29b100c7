"""Model paging (--model-control-mode=paged): 200 small ONNX and Python models under a budget
that holds about 20, served to many clients with a skewed (Zipf) workload.

Every request is answered correctly; the whole server's memory (every process of it), sampled
while the clients run, never exceeds the budget by more than one model's size; a pinned model
stays; a model too big for the budget is refused, a model that fails to load is not retried on
every request; the index, statistics and metrics say what is resident. One calibration server
measures what one model of each kind takes and what the server's own processes take, so the
budget is set in models, not in bytes that differ between hosts.
"""
from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, expect_error, http_get, metric, serving, wait_for, worker_title

from tritond.repository.devices import gpu_count

ONNX_MODELS = 100
PYTHON_MODELS = 100
HOLDS = 20                  # models the budget holds
CLIENTS = 8
REQUESTS_PER_CLIENT = 30
ZIPF_S = 1.1

PY_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.k = np.float32(params["k"]["string_value"])
        mode = params.get("mode", {}).get("string_value", "")
        if mode == "fail":
            raise RuntimeError("this model refuses to load")
        if mode == "big":
            self.ballast = np.ones(int(params["bytes"]["string_value"]) // 8)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + self.k)]))
        return out
'''

IO = '''max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ kind: KIND_CPU count: 1 }]
'''


def params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in values.items())


def add_python(repo: Path, name: str, k: int, **extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(PY_MODEL)
    (repo / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}{params(k=str(k), **extra)}')


def add_onnx(repo: Path, name: str, k: int) -> None:
    """OUTPUT0 = INPUT0 + k."""
    import onnx
    from onnx import TensorProto, helper
    const = helper.make_tensor("k", TensorProto.FLOAT, [1], [float(k)])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "k"], ["OUTPUT0"])], name,
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [4])], [const])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\n{IO}')


def pageable() -> list[tuple[str, int]]:
    """(name, k) of the pageable models: OUTPUT0 = INPUT0 + k."""
    return ([(f"onnx_{i:03d}", i) for i in range(ONNX_MODELS)]
            + [(f"py_{i:03d}", 1000 + i) for i in range(PYTHON_MODELS)])


def paged_args(budget: int, *more: str) -> list[str]:
    return ["--model-control-mode=paged", f"--model-memory-budget={budget}", *more]


def infer(url: str, model: str, protocol: str = "http") -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    mod = httpclient if protocol == "http" else grpcclient
    client = (httpclient.InferenceServerClient(url, network_timeout=120) if protocol == "http"
              else grpcclient.InferenceServerClient(url))
    try:
        inp = mod.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


def index(server: TritondServer) -> dict[str, dict]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return {m["name"]: m for m in client.get_model_repository_index()}
    finally:
        client.close()


def server_pss(server: TritondServer) -> tuple[int, dict[str, int]]:
    """The PSS of every process of the server now, and of each model's workers, read from /proc
    as the test sees them."""
    from tritond.broker.paging.memory import pss_bytes
    total, models = 0, {}
    for pid in server.pids():
        size = pss_bytes(pid) or 0
        total += size
        title = worker_title(pid)
        if title is not None:
            models[title["model"]] = models.get(title["model"], 0) + size
    return total, models


@pytest.fixture(scope="module")
def model_size(tmp_path_factory) -> tuple[int, int]:
    """What one model's workers take on this host with about HOLDS of them resident (a forked
    worker's PSS includes its share of the template's pages, so it shrinks as more share them),
    and what the server's own processes take, measured by a paged server with room for everything."""
    repo = tmp_path_factory.mktemp("calibrate") / "models"
    repo.mkdir()
    names = [f"onnx_{i}" for i in range(HOLDS // 2)] + [f"py_{i}" for i in range(HOLDS // 2)]
    for i, name in enumerate(names):
        (add_onnx if name.startswith("onnx") else add_python)(repo, name, i)
    with serving(TritondServer(repo, paged_args(1 << 40))) as s:
        for name in names:
            infer(s.http_url, name)

        def measured() -> list[float]:
            sizes = [metric(s, "tritond_model_memory_bytes", model=m) for m in names]
            return sizes if all(sizes) else []

        sizes = wait_for(measured, 30, "every model measured")
        server = metric(s, "tritond_server_memory_bytes")
    return int(sum(sizes) / len(sizes)), int(server)


@pytest.fixture(scope="module")
def paged(tmp_path_factory, model_size):
    size, server_base = model_size
    repo = tmp_path_factory.mktemp("paged") / "models"
    repo.mkdir()
    for name, k in pageable():
        (add_onnx if name.startswith("onnx") else add_python)(repo, name, k)
    add_python(repo, "pinned_by_flag", 7)
    add_python(repo, "pinned_by_config", 8, paging_pinned="true")
    add_python(repo, "fails_to_load", 9, mode="fail")
    budget = server_base + (HOLDS + 2) * size        # the two pinned models count too
    add_python(repo, "too_big", 10, mode="big", bytes=str(budget + size))
    server = TritondServer(repo, paged_args(budget, "--load-model=pinned_by_flag"))
    server.budget = budget
    server.model_size = size
    with serving(server) as s:
        yield s


def test_every_model_is_listed_from_the_start_and_pinned_ones_are_resident(paged):
    entries = index(paged)
    assert len(entries) == ONNX_MODELS + PYTHON_MODELS + 4
    for name in ("onnx_000", "py_099", "too_big", "fails_to_load"):
        assert entries[name]["state"] == "UNAVAILABLE", entries[name]
        assert entries[name]["reason"].startswith("paged out"), entries[name]
    for name in ("pinned_by_flag", "pinned_by_config"):
        assert entries[name]["state"] == "READY", entries[name]
    assert metric(paged, "tritond_model_memory_budget_bytes") == paged.budget
    assert metric(paged, "tritond_models_resident") == 0


def test_a_paged_out_model_answers_its_first_request_and_shows_resident(paged):
    np.testing.assert_array_equal(infer(paged.http_url, "onnx_005"), np.arange(4) + 5)
    np.testing.assert_array_equal(infer(paged.grpc_url, "py_005", "grpc"), np.arange(4) + 1005)
    entries = index(paged)
    assert entries["onnx_005"]["state"] == "READY"
    assert entries["py_005"]["state"] == "READY"
    assert metric(paged, "tritond_model_page_ins", model="onnx_005") == 1
    wait_for(lambda: metric(paged, "tritond_model_page_in_first_response_count", model="py_005") == 1, 10,
             "the first response after the page-in counted")
    # a paged-out model has metadata (clients ask before they infer) and statistics
    client = httpclient.InferenceServerClient(paged.http_url)
    try:
        assert client.get_model_metadata("onnx_099")["name"] == "onnx_099"
        stats = client.get_inference_statistics("onnx_005")["model_stats"][0]
        assert stats["paging"]["resident"] is True and stats["paging"]["page_ins"] == 1
        assert stats["memory_usage"] or stats["paging"]["memory_bytes"] == 0
    finally:
        client.close()
    grpc = grpcclient.InferenceServerClient(paged.grpc_url)
    try:
        assert grpc.get_inference_statistics("onnx_099").model_stats[0].name == "onnx_099"
    finally:
        grpc.close()


def test_zipf_clients_are_all_answered_within_the_budget(paged):
    models = pageable()
    weights = [1.0 / (rank + 1) ** ZIPF_S for rank in range(len(models))]
    rng = random.Random(30)
    order = rng.sample(models, len(models))             # popularity unrelated to name or kind
    plans = [rng.choices(order, weights, k=REQUESTS_PER_CLIENT) for _ in range(CLIENTS)]
    pinned_pids = paged.worker_pids("pinned_by_flag") + paged.worker_pids("pinned_by_config")
    errors: list[str] = []
    answered = [0]
    samples: list[tuple[int, dict[str, int]]] = []
    done = threading.Event()

    def client(n: int) -> None:
        protocol = "grpc" if n % 2 else "http"
        url = paged.grpc_url if protocol == "grpc" else paged.http_url
        for name, k in plans[n]:
            try:
                out = infer(url, name, protocol)
                if not np.array_equal(out, np.arange(4, dtype=np.float32) + k):
                    errors.append(f"{name}: wrong answer {out}")
                answered[0] += 1
            except Exception as e:       # noqa: BLE001 -- every failure is reported below
                errors.append(f"{name}: {e}")

    def sampler() -> None:
        while not done.wait(0.2):
            samples.append(server_pss(paged))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    watcher = threading.Thread(target=sampler)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    done.set()
    watcher.join(10)
    assert not any(t.is_alive() for t in threads), "a client did not finish"
    assert not errors, errors[:10]
    assert answered[0] == CLIENTS * REQUESTS_PER_CLIENT
    largest = max(size for _, models in samples for size in models.values())
    worst = max(total for total, _ in samples)
    assert worst <= paged.budget + largest, (worst, paged.budget, largest)
    assert sum(metric(paged, "tritond_model_page_outs", model=m) for m, _ in models) > 0, "nothing was paged out"
    assert metric(paged, "tritond_model_memory_used_bytes") > metric(paged, "tritond_server_memory_bytes") > 0
    # the pinned models kept their workers, never paged out
    assert sorted(paged.worker_pids("pinned_by_flag") + paged.worker_pids("pinned_by_config")) == sorted(pinned_pids)
    entries = index(paged)
    assert entries["pinned_by_flag"]["state"] == entries["pinned_by_config"]["state"] == "READY"
    resident = [n for n, e in entries.items() if e.get("state") == "READY"]
    assert len(resident) - 2 == metric(paged, "tritond_models_resident")


def test_a_model_paged_out_is_paged_in_again_on_its_next_request(paged):
    infer(paged.http_url, "onnx_010")
    before = metric(paged, "tritond_model_page_ins", model="onnx_010")
    outs = metric(paged, "tritond_model_page_outs", model="onnx_010")
    for name, k in pageable()[20:]:          # others, until they pushed it out
        np.testing.assert_array_equal(infer(paged.http_url, name), np.arange(4) + k)
        if metric(paged, "tritond_model_page_outs", model="onnx_010") > outs:
            break
    assert metric(paged, "tritond_model_page_outs", model="onnx_010") == outs + 1
    assert index(paged)["onnx_010"]["state"] == "UNAVAILABLE"
    np.testing.assert_array_equal(infer(paged.http_url, "onnx_010"), np.arange(4) + 10)
    assert metric(paged, "tritond_model_page_ins", model="onnx_010") == before + 1


def test_a_model_that_fails_to_load_is_not_retried_on_every_request(paged):
    expect_error(lambda: infer(paged.http_url, "fails_to_load"), 503, "this model refuses to load")
    err = expect_error(lambda: infer(paged.grpc_url, "fails_to_load", "grpc"), 503, "tried again in",
                       protocol="grpc")
    assert "this model refuses to load" in err.message()
    assert metric(paged, "tritond_model_page_ins", model="fails_to_load") == 1
    entry = index(paged)["fails_to_load"]
    assert entry["state"] == "UNAVAILABLE" and "last load failed" in entry["reason"], entry
    np.testing.assert_array_equal(infer(paged.http_url, "py_001"), np.arange(4) + 1001)    # the server carries on


def test_a_model_bigger_than_the_budget_is_refused(paged):
    def refused() -> bool:
        try:
            infer(paged.http_url, "too_big")
        except Exception as e:       # noqa: BLE001 -- the refusal is what is waited for
            return "more than the --model-memory-budget" in str(e)
        return False

    wait_for(refused, 60, "too_big to be refused", every=0.5)
    expect_error(lambda: infer(paged.http_url, "too_big"), 503, "more than the --model-memory-budget")
    assert metric(paged, "tritond_model_page_ins", model="too_big") == 1
    wait_for(lambda: not paged.worker_pids("too_big"), 30, "too_big's worker to leave")
    np.testing.assert_array_equal(infer(paged.http_url, "onnx_001"), np.arange(4) + 1)
    assert http_get(f"http://{paged.http_url}/v2/health/ready")[0] == 200


@pytest.mark.skipif(gpu_count() > 0, reason="checks the refusal on a host without GPUs")
def test_a_gpu_budget_for_a_gpu_the_host_lacks_stops_startup(tmp_path):
    repo = tmp_path / "models"
    add_python(repo, "m", 1)
    s = TritondServer(repo, paged_args(1 << 30, "--model-gpu-memory-budget=0:1000000")).start(wait="exit", timeout=60)
    assert s.returncode != 0 and "names GPU 0, which this host does not have (0 GPU(s))" in s.log, s.log
    s.assert_clean()
