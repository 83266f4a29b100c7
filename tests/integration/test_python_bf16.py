"""BF16 in a Python model, as Triton's python backend has it (L0_backend_python test_bf16): the
input's as_numpy() is refused, DLPack carries it to torch and back, and the output reaches the
client as BF16; a BLS call carries it to another model and back as BF16."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, serving

pytest.importorskip("torch")

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_BF16 dims: [-1] }]
output [{ name: "OUTPUT0" data_type: TYPE_BF16 dims: [-1] }]
"""

MODEL = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Doubles a BF16 input in torch.\"\"\"

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                x.as_numpy()
                raise RuntimeError("as_numpy() of a BF16 tensor answered")
            except pb_utils.TritonModelException as e:
                assert "tensor dtype is bf16 and cannot be converted to numpy" in str(e).lower()
            assert x.triton_dtype() == 14
            doubled = torch.utils.dlpack.from_dlpack(x.to_dlpack()) * 2
            assert doubled.dtype == torch.bfloat16
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack(
                "OUTPUT0", torch.utils.dlpack.to_dlpack(doubled))]))
        return out
"""


CALLER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Sends its BF16 input to 'bf16' by BLS and answers with what comes back.\"\"\"

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            reply = pb_utils.InferenceRequest(model_name="bf16", requested_output_names=["OUTPUT0"],
                                              inputs=[pb_utils.Tensor.from_dlpack("INPUT0", x.to_dlpack())]).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
            assert y.triton_dtype() == 14, y.triton_dtype()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", y.to_dlpack())]))
        return out
"""


@pytest.mark.parametrize("model", ["bf16", "bf16_caller"])
def test_a_bf16_tensor_goes_through_torch_and_back_to_the_client(tmp_path, model):
    """Straight to the doubling model, or through a caller that sends it there by BLS."""
    for name, source in (("bf16", MODEL), ("bf16_caller", CALLER)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG)
        (tmp_path / name / "1" / "model.py").write_text(source)
    x = np.array([1.5, -2, 3.25], dtype=ml_dtypes.bfloat16)
    with serving(TritondServer(tmp_path, grpc=False)) as s:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "BF16")
        inp.set_data_from_numpy(x)
        result = httpclient.InferenceServerClient(s.http_url).infer(model, [inp])
    assert result.get_response()["outputs"][0]["datatype"] == "BF16"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (x.astype(np.float32) * 2).astype(ml_dtypes.bfloat16))
