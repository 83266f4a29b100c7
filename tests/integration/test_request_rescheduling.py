"""Request rescheduling, as Triton has it (qa/L0_backend_python request_rescheduling,
L0_iterative_sequence): a Python model of an iterative sequence batcher releases a request with
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE to run it again in its sequence; a request without a
correlation id starts a sequence of its own; a model that is not iterative cannot reschedule."""
from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, expect_error, serving

COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Sends IN responses, one per execution, counting down to 0; rescheduled in between.\"\"\"

    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            seq = request.correlation_id()
            if seq not in self.left or request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.left[seq] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.left[seq] -= 1
            last = self.left[seq] == 0
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.left[seq]], np.int32))])
            request.get_response_sender().send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            if not last:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return None
"""

ADD_ONCE_MORE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Runs each request twice: the first time it only counts, the second it answers IN + runs.\"\"\"

    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        out = []
        for request in requests:
            seq = request.correlation_id()
            self.runs[seq] = self.runs.get(seq, 0) + 1
            if self.runs[seq] == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append({BAD})
                continue
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + self.runs.pop(seq))]))
        return out
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [{{ name: "IN" data_type: TYPE_INT32 dims: [1] }}]
output [{{ name: "OUT" data_type: TYPE_INT32 dims: [1] }}]
instance_group [{{ kind: KIND_CPU }}]
{extra}
"""
ITERATIVE = "sequence_batching { iterative_sequence: true }"
DECOUPLED = "model_transaction_policy { decoupled: true }"


def _model(repo, name: str, source: str, *extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(extra="\n".join(extra)))
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("rescheduling")
    _model(repo, "countdown", COUNTDOWN, ITERATIVE, DECOUPLED)
    _model(repo, "countdown_plain", COUNTDOWN, DECOUPLED)
    _model(repo, "add_once_more", ADD_ONCE_MORE.replace("{BAD}", "None"), ITERATIVE)
    _model(repo, "add_plain", ADD_ONCE_MORE.replace("{BAD}", "None"))
    _model(repo, "add_wrong_return", ADD_ONCE_MORE.replace("{BAD}", "pb_utils.InferenceResponse([])"), ITERATIVE)
    with serving(TritondServer(repo)) as s:
        yield s


def _stream(server, model: str, values: list[int], **kw) -> list:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, v in enumerate(values):
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([v], np.int32))
        client.async_stream_infer(model, [inp], request_id=str(i), **kw)
    got = []
    while len([g for g in got if g[2]]) < len(values):
        result, error = answers.get(timeout=30)
        if error is not None:
            got.append((None, error.message(), True))
            continue
        response = result.get_response()
        got.append((response.id, int(result.as_numpy("OUT")[0]), True))
        if got[-1][1] != 0:
            got[-1] = got[-1][:2] + (False,)
    client.stop_stream()
    client.close()
    return got


def test_a_decoupled_model_runs_each_request_again_until_it_is_done(server):
    got = _stream(server, "countdown", [3, 2])
    by_request = {rid: [v for r, v, _ in got if r == rid] for rid in ("0", "1")}
    assert by_request == {"0": [2, 1, 0], "1": [1, 0]}, got


def test_a_model_that_is_not_iterative_cannot_reschedule(server):
    got = _stream(server, "countdown_plain", [3], sequence_id=0)
    assert got[0][:2] == ("0", 2) and "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while " \
                                      "the model is not configured to handle such a flag." in got[1][1], got
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([5], np.int32))
    expect_error(lambda: client.infer("add_plain", [inp]), 400,
                 "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE")


def test_a_request_answers_after_it_ran_again(server):
    client = httpclient.InferenceServerClient(server.http_url)
    for value in (5, 7):
        inp = httpclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([value], np.int32))
        assert int(client.infer("add_once_more", [inp]).as_numpy("OUT")[0]) == value + 2
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    expect_error(lambda: client.infer("add_wrong_return", [inp]), 500,
                 "Expected a None object in the execute function return list for reschduled request, found type")
