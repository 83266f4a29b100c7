"""A non-decoupled Python model answering through its response sender, as Triton's stub takes it
(L0_backend_python/response_sender): a response sent after execute() returned (None, or None in
its list) reaches the client; a response sent before execute() returns is the answer even when
execute() then returns one or fails on a second send."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, serving

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "MODE" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "INDEX" data_type: TYPE_INT32 dims: [1] }]
"""

MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answer(index):
    return pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32))])


def later(sender, index):
    time.sleep(0.3)
    sender.send(answer(index), flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        for request in requests:
            mode = int(request.inputs()[0].as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:                   # sent before return, then a response returned as well
                sender.send(answer(1000), flags=FINAL)
                returned.append(answer(0))
            elif mode in (1, 2):            # sent after return; execute returns [None] or None
                threading.Thread(target=later, args=(sender, 2000), daemon=True).start()
                returned.append(None)
            else:                           # a second send fails the model after the first went out
                sender.send(answer(1000))
                sender.send(answer(1001))
        return None if mode == 2 else returned
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sender") / "models"
    (repo / "sender" / "1").mkdir(parents=True)
    (repo / "sender" / "config.pbtxt").write_text(CONFIG)
    (repo / "sender" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    with serving(TritondServer(repo)) as s:
        c = httpclient.InferenceServerClient(s.http_url)
        yield c
        c.close()


@pytest.mark.parametrize("mode, index", [(0, 1000), (1, 2000), (2, 2000), (3, 1000)])
def test_the_response_sent_through_the_sender_is_the_answer(client, mode, index):
    inp = httpclient.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([mode], dtype=np.int32))
    assert client.infer("sender", [inp]).as_numpy("INDEX").tolist() == [index]
