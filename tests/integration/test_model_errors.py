"""A model's own errors as its author needs them: the client's message names the exception type
in the words of Triton's python backend ("Failed to process the request(s) for model '<instance>',
message: <Type>: <message>" and the model's frames), the server log carries the type and the
frames at the default verbosity, a load failure is logged once with its version, and an ensemble
is logged as loaded like every other model."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, expect_error, http_get, serving, wait_for

IO = """
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]
"""

RAISES_IN_EXECUTE = """
class TritonPythonModel:
    def execute(self, requests):
        return self.divide(requests)

    def divide(self, requests):
        return 1 / 0
"""

RAISES_IN_INITIALIZE = """
class TritonPythonModel:
    def initialize(self, args):
        raise KeyError("the weights are missing")

    def execute(self, requests):
        return []
"""

ENSEMBLE = """
platform: "ensemble"
ensemble_scheduling { step [{ model_name: "divides" model_version: -1
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } }] }
"""


def python_model(repo: Path, name: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}')
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


def repository(repo: Path) -> Path:
    python_model(repo, "divides", RAISES_IN_EXECUTE)
    python_model(repo, "broken_init", RAISES_IN_INITIALIZE)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(IO + ENSEMBLE)
    (repo / "bad_onnx" / "1").mkdir(parents=True)
    (repo / "bad_onnx" / "config.pbtxt").write_text(f'backend: "onnxruntime"\n{IO}')
    (repo / "bad_onnx" / "1" / "model.onnx").write_bytes(unknown_op_model())
    return repo


def unknown_op_model() -> bytes:
    """A well-formed ONNX file that ONNX Runtime refuses to load (an operator it does not know)."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["IN"], ["OUT"])], "g",
                              [helper.make_tensor_value_info("IN", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


@pytest.fixture(scope="module")
def eserver(tmp_path_factory):
    repo = repository(tmp_path_factory.mktemp("errors") / "models")
    with serving(TritondServer(repo, ["--exit-on-error=false"]), wait="live") as s:
        wait_for(lambda: http_get(f"http://{s.http_url}/v2/models/pipeline/ready", 2.0)[0] == 200, 90,
                 "the ensemble to be ready")
        wait_for(lambda: "bad_onnx' version 1 is UNAVAILABLE" in s.log, 90, "the ONNX model to fail")
        yield s


def expected_execute_error(repo: Path) -> str:
    path = repo / "divides" / "1" / "model.py"
    return ("Failed to process the request(s) for model 'divides_0', message: ZeroDivisionError: division by zero"
            f"\n\nAt:\n  {path}(7): divide\n  {path}(4): execute\n")


@pytest.mark.parametrize("client", [httpclient, grpcclient])
def test_an_exception_in_execute_names_its_type_and_frames_to_the_client(eserver, client):
    c = client.InferenceServerClient(eserver.http_url if client is httpclient else eserver.grpc_url)
    inp = client.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
    expect_error(lambda: c.infer("divides", [inp]), 500, expected_execute_error(eserver.repos[0]), exact=True,
                 protocol="http" if client is httpclient else "grpc")
    wait_for(lambda: expected_execute_error(eserver.repos[0]) in eserver.log, 30, "the error in the log")
    c.close()


def test_an_exception_in_initialize_is_logged_once_with_its_type_and_frames(eserver):
    path = eserver.repos[0] / "broken_init" / "1" / "model.py"
    text = f"KeyError: 'the weights are missing'\n\nAt:\n  {path}(4): initialize\n"
    entry = next(m for m in httpclient.InferenceServerClient(eserver.http_url).get_model_repository_index()
                 if m["name"] == "broken_init")
    assert entry["state"] == "UNAVAILABLE" and text in entry["reason"], entry
    assert eserver.log_outside_tables.count("KeyError: 'the weights are missing'") == 1, eserver.log
    assert f"model 'broken_init' version 1 is UNAVAILABLE: load failed for model 'broken_init': {text}" in eserver.log


def test_a_framework_load_error_is_logged_with_its_type_and_traceback(eserver):
    log = eserver.log
    start = log.index("failed to load model 'bad_onnx' version 1 instance 'bad_onnx_0'")
    tail = log[start:]
    assert "Traceback (most recent call last)" in tail
    assert "onnxruntime_pybind11_state.InvalidGraph" in tail and "No Op registered for NoSuchOp" in tail, tail


def test_an_ensemble_is_logged_as_loaded_and_ready(eserver):
    assert "loaded model 'pipeline' version 1 in " in eserver.log
    assert "model 'pipeline' version 1 is READY" in eserver.log


def test_a_startup_load_error_is_logged_once_and_without_a_version_it_does_not_have(tmp_path):
    repo = tmp_path / "models"
    python_model(repo, "divides", RAISES_IN_EXECUTE)
    (repo / "divides" / "config.pbtxt").write_text(f'backend: "python"\n{IO}\nno_such_field: 1\n')
    s = TritondServer(repo).start(wait="exit")
    assert s.returncode == 1
    said = s.log_outside_tables
    assert said.count('has no field named "no_such_field"') == 1, s.log
    assert "version 0" not in said
    # Triton's start-up table names it once more, with the reason
    row = next(line for line in s.log.splitlines() if line.startswith("| divides "))
    assert "| UNAVAILABLE: " in row and 'has no field named "no_such_field"' in row, s.log
    assert "failed to load at startup (--exit-on-error=true): 'divides'\n" in s.log
    s.assert_clean()
