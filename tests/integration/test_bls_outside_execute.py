"""BLS outside execute(): Triton's stub refuses an `exec` while the model initializes or
finalizes ("BLS is only supported during the 'execute' function."), so a model calling one in
initialize() fails to load and one calling it in finalize() logs the refusal
(L0_backend_python/bls's bls_init_error and bls_finalize_error)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import TritondServer, serving, wait_for

MESSAGE = "BLS is only supported during the 'execute' function."

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]
"""

BLS_IN = """
import numpy as np
import triton_python_backend_utils as pb_utils


def call():
    request = pb_utils.InferenceRequest(model_name="callee", requested_output_names=["OUT"],
                                        inputs=[pb_utils.Tensor("IN", np.ones(1, dtype=np.float32))])
    request.exec()


class TritonPythonModel:
    def {hook}(self, *args):
        call()

    def execute(self, requests):
        return []
"""

CALLEE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""


def repository(repo: Path, hook: str) -> Path:
    for name, code in (("caller", BLS_IN.replace("{hook}", hook)), ("callee", CALLEE)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    return repo


def test_bls_in_initialize_fails_the_load(tmp_path):
    s = TritondServer(repository(tmp_path / "models", "initialize")).start(wait="exit")
    assert s.returncode == 1
    assert MESSAGE in s.log, s.log
    assert "failed to load at startup (--exit-on-error=true): 'caller'" in s.log, s.log
    s.assert_clean()


def test_bls_in_finalize_is_refused_and_logged(tmp_path):
    with serving(TritondServer(repository(tmp_path / "models", "finalize"))) as s:
        pass
    wait_for(lambda: MESSAGE in s.log, 10, "the refusal in the log")
