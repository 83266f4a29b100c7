"""Echoes one tensor of each common datatype (FP32, INT64, BOOL, FP16, BYTES).

INPUT_<T> comes back unchanged as OUTPUT_<T>, so a client can check that every datatype
survives the JSON, binary and gRPC encodings bit for bit.
"""
import triton_python_backend_utils as pb_utils

DATATYPES = ("FP32", "INT64", "BOOL", "FP16", "BYTES")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [
                pb_utils.Tensor(
                    f"OUTPUT_{dt}",
                    pb_utils.get_input_tensor_by_name(request, f"INPUT_{dt}").as_numpy(),
                )
                for dt in DATATYPES
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
