"""How a Python model's files load, as Triton's python backend loads them (L0_backend_python's
top-level test.sh): model.py is imported as a module of its version directory, so a model split
over several files may import its siblings relatively; a missing model.py and a stub that dies
in initialize() fail the load with Triton's words, which test.sh greps in the server log."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from conftest import TritondServer, serving

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }}]
instance_group [{{ kind: KIND_CPU }}]
"""

MULTI_FILE = """
import helper_absolute
import triton_python_backend_utils as pb_utils

from . import helper_relative


class TritonPythonModel:
    def execute(self, requests):
        scale = helper_absolute.SCALE * helper_relative.SCALE
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() * scale)])
                for r in requests]
"""

DIES_IN_INITIALIZE = """
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, requests):
        return []
"""


def model(repo: Path, name: str, files: dict[str, str]) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    for filename, text in files.items():
        (repo / name / "1" / filename).write_text(textwrap.dedent(text))
    return repo / name


def test_a_model_imports_its_sibling_files_absolutely_and_relatively(tmp_path):
    repo = tmp_path / "models"
    model(repo, "multi_file", {"model.py": MULTI_FILE, "helper_absolute.py": "SCALE = 2.0\n",
                               "helper_relative.py": "SCALE = 3.0\n"})
    with serving(TritondServer(repo)) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.5], dtype=np.float32))
        assert client.infer("multi_file", [inp]).as_numpy("OUTPUT0").tolist() == [9.0]
        client.close()


def test_a_missing_model_py_fails_the_load_in_triton_words(tmp_path):
    repo = tmp_path / "models"
    model(repo, "no_model_file", {})
    s = TritondServer(repo).start(wait="exit")
    path = os.path.join(repo, "no_model_file", "1", "model.py")
    assert s.returncode == 1
    assert f"Failed to preinitialize Python stub: Python model file not found in '{path}'" in s.log, s.log
    assert "failed to load 'no_model_file'" in s.log, s.log
    s.assert_clean()


def test_a_stub_killed_in_initialize_fails_the_load_as_not_healthy(tmp_path):
    repo = tmp_path / "models"
    model(repo, "init_exit", {"model.py": DIES_IN_INITIALIZE})
    s = TritondServer(repo).start(wait="exit")
    assert s.returncode == 1
    assert "Stub process 'init_exit_0_0' is not healthy." in s.log, s.log
    s.assert_clean()


SELF_TEST = """
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class SelfTest(unittest.TestCase):
    def test_runs(self):
        self.assertTrue(True)


class TritonPythonModel:
    def initialize(self, args):
        self.passed = unittest.main("model", exit=False).result.wasSuccessful()

    def execute(self, requests):
        out = np.array([float(self.passed)], dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
"""


def test_a_model_runs_unittest_main_on_itself_as_under_triton_stub(tmp_path):
    """Triton's stub has an empty sys.argv, so unittest.main() in a model (as the qa models do)
    runs the model's own tests rather than reading the worker's command line."""
    repo = tmp_path / "models"
    model(repo, "self_test", {"model.py": SELF_TEST})
    with serving(TritondServer(repo)) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
        assert client.infer("self_test", [inp]).as_numpy("OUTPUT0").tolist() == [1.0]
        client.close()
