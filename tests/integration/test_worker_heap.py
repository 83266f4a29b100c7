"""A worker keeps the memory of its large per-request allocations for the next request
(shm/heap.py): a model that makes MiB-sized arrays per request, like a BYTES input decoded into
bytes objects and a preprocessing step's outputs, does not have the kernel map and zero-fill
those pages again every time. Page faults per request tell, not time."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TritondServer, serving

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            # 4 MiB in four 1 MiB arrays, made and dropped per request: glibc's own thresholds
            # (raised to the largest block freed, and twice that for trimming) would hand the
            # pages back to the kernel after every request
            scratch = [np.ones(1 << 18, np.float32) for _ in range(4)]
            total = np.array([sum(float(a.sum()) for a in scratch)], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)]))
        return out
'''

CONFIG = '''name: "scratch"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
REQUESTS = 20
PAGES_4MIB = (4 << 20) // 4096


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = tmp_path_factory.mktemp("heap") / "models"
    (repo / "scratch" / "1").mkdir(parents=True)
    (repo / "scratch" / "1" / "model.py").write_text(MODEL_PY)
    (repo / "scratch" / "config.pbtxt").write_text(CONFIG)
    with serving(TritondServer(repo)) as s:
        yield s


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_a_models_large_scratch_arrays_reuse_the_workers_heap(srv):
    client = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    try:
        for _ in range(3):
            client.infer("scratch", [x])
        [pid] = srv.worker_pids("scratch")
        before = minor_faults(pid)
        for _ in range(REQUESTS):
            assert client.infer("scratch", [x]).as_numpy("TOTAL")[0] == 1 << 20
        per_request = (minor_faults(pid) - before) / REQUESTS
    finally:
        client.close()
    assert per_request < PAGES_4MIB / 4, f"{per_request:.0f} page faults per request"
