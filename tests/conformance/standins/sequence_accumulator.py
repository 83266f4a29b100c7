"""Stand-in for Triton's C++ `sequence` test backend (qa/custom_models/custom_sequence_int32),
with that model's config but `backend: "python"`.

Per sequence (correlation id) it keeps an INT32 accumulator: a request with READY=0 changes
nothing; START=1 sets it to the sum of INPUT's elements, otherwise the sum is added. Every
ready request gets the accumulator in each element of OUTPUT (INPUT's shape). Each execution
waits `execute_delay_ms` (a config parameter) first, as the C++ backend does.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = int(params.get("execute_delay_ms", {}).get("string_value", "0")) / 1000.0
        self.accumulators = {}

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0]
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().reshape(-1)[0]
            corrid = request.correlation_id()
            if ready:
                total = int(values.astype(np.int64).sum())
                self.accumulators[corrid] = total if start else self.accumulators.get(corrid, 0) + total
            out = np.full(values.shape, self.accumulators.get(corrid, 0), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
