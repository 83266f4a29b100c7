"""A stateful accumulator: OUTPUT = ACC_IN + INPUT, and the new sum is also ACC_OUT, which the
server keeps as the sequence's state and feeds back as ACC_IN on its next request (zero at
START). Slots without a request in a batch come with READY = 0 and change nothing.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            total = (acc + x * ready).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
