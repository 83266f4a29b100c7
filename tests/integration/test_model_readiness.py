"""A Python model's own `is_ready()`, asked whenever a client asks whether the model is ready, as
Triton's python backend asks it (L0_backend_python/model_readiness): its answer over HTTP and
gRPC, an exception or a non-boolean answer as not ready, a check slower than 5 s as not ready
while the late answer serves the next client, and inference unaffected throughout."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, serving

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]
"""

MODEL = """
import os
import time
import triton_python_backend_utils as pb_utils

ANSWER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "answer")


class TritonPythonModel:
    \"\"\"is_ready() answers as the file `answer` beside config.pbtxt says.\"\"\"

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]

    def is_ready(self):
        answer = open(ANSWER).read()
        if answer == "slow":
            time.sleep(7)
            return True
        if answer == "raise":
            raise RuntimeError("the check failed")
        return {"yes": True, "no": False}.get(answer, answer)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("readiness")
    (root / "checked" / "1").mkdir(parents=True)
    (root / "checked" / "config.pbtxt").write_text(CONFIG)
    (root / "checked" / "1" / "model.py").write_text(MODEL)
    (root / "checked" / "answer").write_text("yes")
    with serving(TritondServer(root)) as s:
        s.answer = root / "checked" / "answer"
        yield s


def ready(server) -> tuple[bool, bool]:
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        return httpclient.InferenceServerClient(server.http_url).is_model_ready("checked"), g.is_model_ready("checked")


def infers(server) -> bool:
    inp = httpclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.array([2.0], np.float32))
    return httpclient.InferenceServerClient(server.http_url).infer("checked", [inp]).as_numpy("OUTPUT0")[0] == 2.0


@pytest.mark.parametrize("answer, expected", [("yes", True), ("no", False), ("raise", False), ("maybe", False)])
def test_the_models_own_answer_is_the_readiness(server, answer, expected):
    Path(server.answer).write_text(answer)
    assert ready(server) == (expected, expected)
    assert infers(server), "inference does not depend on the check"
    if not expected:
        assert "Model 'checked' version 1 is not ready:" in server.log


def test_a_check_slower_than_five_seconds_is_not_ready_and_its_late_answer_serves_the_next_client(server):
    Path(server.answer).write_text("slow")
    started = time.monotonic()
    assert not httpclient.InferenceServerClient(server.http_url).is_model_ready("checked")
    assert 4.5 < time.monotonic() - started < 7
    assert infers(server), "the check runs beside execute()"
    Path(server.answer).write_text("no")
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        assert g.is_model_ready("checked"), "the check in flight answered, not a new one"
    assert "Timed out waiting for user-defined is_ready() response" in server.log
