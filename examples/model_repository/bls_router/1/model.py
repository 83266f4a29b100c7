"""Route each request to one of two models through BLS, and say which one served it.

The request parameter "route" picks the model: "identity" sends INPUT0 to identity_fp32
(Python, OUTPUT0 = INPUT0); "add_sub" sends INPUT0 as both inputs of add_sub_onnx (ONNX,
OUTPUT0 = 2 * INPUT0). Without the parameter the input decides: a non-negative sum goes to
add_sub, a negative one to identity. The called model's error becomes this request's error.
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

ROUTES = ("identity", "add_sub")


def route_of(request, x: np.ndarray) -> str:
    route = json.loads(request.parameters() or "{}").get("route")
    if route is None:
        return "add_sub" if float(x.sum()) >= 0 else "identity"
    if route not in ROUTES:
        raise ValueError(f"unknown route '{route}', expected one of {', '.join(ROUTES)}")
    return route


def call(route: str, x: np.ndarray) -> pb_utils.InferenceResponse:
    if route == "identity":
        request = pb_utils.InferenceRequest(
            model_name="identity_fp32", inputs=[pb_utils.Tensor("INPUT0", x)],
            requested_output_names=["OUTPUT0"])
        return request.exec()
    batch = x[np.newaxis, :]
    request = pb_utils.InferenceRequest(
        model_name="add_sub_onnx",
        inputs=[pb_utils.Tensor("INPUT0", batch), pb_utils.Tensor("INPUT1", batch)],
        requested_output_names=["OUTPUT0"])
    return request.exec()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            try:
                route = route_of(request, x)
            except ValueError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
                continue
            result = call(route, x)
            if result.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"{route} route failed: {result.error().message()}")))
                continue
            out = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy().reshape(x.shape)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", out.astype(np.float32)),
                pb_utils.Tensor("ROUTE", np.array([route.encode()], dtype=object)),
            ]))
        return responses
