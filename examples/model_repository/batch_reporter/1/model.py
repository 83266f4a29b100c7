"""Identity that reports how the dynamic batcher grouped the requests it was given.

Per request: OUTPUT0 = INPUT0, BATCH_SIZE = number of requests in this execute() call,
BATCH_ELEMENTS = sum of their batch dimensions (both shaped [batch, 1], one row per
element of the request). A request parameter "sleep_ms" makes the call sleep before
answering (the longest one in the call wins), to hold the instance busy while a test
queues more requests.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        sleep_ms = max(float(json.loads(r.parameters() or "{}").get("sleep_ms", 0)) for r in requests)
        if sleep_ms > 0:
            time.sleep(sleep_ms / 1000.0)
        n_requests = len(requests)
        n_elements = sum(x.shape[0] for x in inputs)
        responses = []
        for x in inputs:
            rows = (x.shape[0], 1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", x),
                        pb_utils.Tensor("BATCH_SIZE", np.full(rows, n_requests, dtype=np.int32)),
                        pb_utils.Tensor("BATCH_ELEMENTS", np.full(rows, n_elements, dtype=np.int32)),
                    ]
                )
            )
        return responses
