"""BYTES in, BYTES and INT32 out: exercises variable-length string tensors both ways.

OUTPUT0 is each UTF-8 element upper-cased, OUTPUT1 its length in characters. An element
that is not valid UTF-8 fails only the request that carried it.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            items = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            try:
                texts = [item.decode("utf-8") for item in items.ravel()]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(f"INPUT0 is not UTF-8: {exc}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            upper = np.array([t.upper().encode("utf-8") for t in texts], dtype=np.object_)
            lengths = np.array([len(t) for t in texts], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", upper.reshape(items.shape)),
                        pb_utils.Tensor("OUTPUT1", lengths.reshape(items.shape)),
                    ]
                )
            )
        return responses
