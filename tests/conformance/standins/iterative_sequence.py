"""Stand-in for Triton's C++ `iterative_sequence` test backend (server src/test/iterative_sequence),
installed as a Python-based backend (`<backend directory>/iterative_sequence/model.py`), so the
qa's configs with `backend: "iterative_sequence"` run it unchanged.

A request's INT32 INPUT says how many responses its sequence (correlation id) gets. Each
execution sends one response, OUTPUT = the responses still to come, waits 0.5 s, and releases
the request to run again (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) until the count reaches 0,
whose response is the final one. Where the model's scheduler cannot reschedule, the server
answers the request with its release error, as Triton's core does.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.batching = json.loads(args["model_config"]).get("max_batch_size", 0) > 0
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            corrid = request.correlation_id()
            if corrid not in self.remaining:
                self.remaining[corrid] = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            self.remaining[corrid] -= 1
            left = self.remaining[corrid]
            out = np.array([[left]] if self.batching else [left], dtype=np.int32)
            last = left <= 0
            if last:
                del self.remaining[corrid]
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            time.sleep(0.5)
            if not last:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return None
