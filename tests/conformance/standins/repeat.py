"""Stand-in for Triton's C++ `repeat` test backend (triton-inference-server/repeat_backend) in a
model whose config is not decoupled, which python_backend's examples/decoupled/repeat_model.py
(the stand-in for its decoupled models) refuses to load.

As the C++ backend: for each element e of IN, wait DELAY[e] ms, then respond OUT = IN[e],
IDX = e, from a thread of its own; the request is released after the batch's WAIT ms. A request
to a model that is not decoupled gets one response under Triton, its first (the core keeps the
first response of a non-decoupled request), so that is the one this sends.
"""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        wait_ms = 0
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)
            wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().reshape(-1)[0])
            threading.Thread(target=self._respond, args=(request.get_response_sender(), values, delays),
                             daemon=True).start()
        time.sleep(wait_ms / 1000)
        return None

    @staticmethod
    def _respond(sender, values, delays):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if not len(values):         # no response to send, which a non-decoupled request cannot take
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("IN has no elements")), flags=final)
            return
        time.sleep(int(delays[0]) / 1000)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([values[0]], np.int32)),
                                                pb_utils.Tensor("IDX", np.array([0], np.uint32))]), flags=final)
