"""On a gRPC stream, as in Triton's stream handler: the responses to requests for models that are
not decoupled leave in the order the requests came, whichever finishes first (qa/
L0_sequence_batcher SequenceBatcherPreserveOrderingTest reads them so), an error for an unknown
model included; the stream keeps being read while answers wait for their turn."""
from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient

from conftest import TritondServer, serving

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "MS" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "MS_OUT" data_type: TYPE_INT32 dims: [1] }]
instance_group [{ kind: KIND_CPU count: 3 }]
"""

MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Sleeps the milliseconds it is given, then answers them.\"\"\"

    def execute(self, requests):
        out = []
        for r in requests:
            ms = pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("MS_OUT", ms)]))
        return out
"""


def test_responses_leave_in_the_order_their_requests_came(tmp_path):
    (tmp_path / "sleepy" / "1").mkdir(parents=True)
    (tmp_path / "sleepy" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "sleepy" / "1" / "model.py").write_text(MODEL)
    with serving(TritondServer(tmp_path)) as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        sent = [("1", "sleepy", 800), ("2", "sleepy", 0), ("3", "nowhere", 0), ("4", "sleepy", 300), ("5", "sleepy", 0)]
        for rid, model, ms in sent:
            inp = grpcclient.InferInput("MS", [1], "INT32")
            inp.set_data_from_numpy(np.array([ms], np.int32))
            client.async_stream_infer(model, [inp], request_id=rid)
        got = [answers.get(timeout=30) for _ in sent]
        client.stop_stream()
        client.close()
    order = [r.get_response().id if r is not None else "error" for r, _ in got]
    assert order == ["1", "2", "error", "4", "5"], order
    assert "Request for unknown model: 'nowhere'" in got[2][1].message()
    assert [int(r.as_numpy("MS_OUT")[0]) for r, _ in got if r is not None] == [800, 0, 300, 0]
