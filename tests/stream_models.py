"""Model repositories for the sequence and streaming integration tests: the examples
(accumulator, toy_llm) in the configurations the tests need, and the decoupled test model
(tests/fixtures/stream_model.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

from conftest import build_example_repository
from fault_models import add_fault_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STREAM_MODEL = FIXTURES / "stream_model.py"


def accumulator(repo: Path, name: str, *, max_batch_size: int = 8, count: int = 1, strategy: str = "direct { }",
                idle_us: int = 5_000_000) -> None:
    """The example accumulator under another name, strategy, batch size and instance count."""
    source = (repo / "accumulator" / "config.pbtxt").read_text()
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(repo / "accumulator" / "1" / "model.py", repo / name / "1" / "model.py")
    text = (source.replace('name: "accumulator"', f'name: "{name}"')
            .replace("max_batch_size: 8", f"max_batch_size: {max_batch_size}")
            .replace("direct { }", strategy)
            .replace("max_sequence_idle_microseconds: 5000000", f"max_sequence_idle_microseconds: {idle_us}")
            .replace("count: 1 kind", f"count: {count} kind"))
    (repo / name / "config.pbtxt").write_text(text)


def stream_model(repo: Path, name: str = "streamer") -> None:
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(STREAM_MODEL, repo / name / "1" / "model.py")
    (repo / name / "config.pbtxt").write_text(f'''name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
''')


def bls_llm(repo: Path) -> None:
    """A model that calls toy_llm with exec(decoupled=True) and joins the tokens."""
    (repo / "bls_llm" / "1").mkdir(parents=True)
    shutil.copyfile(FIXTURES / "bls_llm_model.py", repo / "bls_llm" / "1" / "model.py")
    (repo / "bls_llm" / "config.pbtxt").write_text('''name: "bls_llm"
backend: "python"
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
''')


def llm_ensemble(repo: Path) -> None:
    """An ensemble whose one step is the decoupled toy_llm."""
    (repo / "llm_ensemble" / "1").mkdir(parents=True)
    (repo / "llm_ensemble" / "config.pbtxt").write_text('''name: "llm_ensemble"
platform: "ensemble"
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "LIMIT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "toy_llm" model_version: -1
  input_map { key: "text_input" value: "PROMPT" } input_map { key: "max_tokens" value: "LIMIT" }
  output_map { key: "text_output" value: "TOKEN" } } ] }
''')


SQUARE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.square(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()))]) for r in requests]
"""


def fan_ensemble(repo: Path) -> None:
    """The decoupled streamer feeding a squaring step: each streamed value is squared on its own."""
    (repo / "square_i32" / "1").mkdir(parents=True)
    (repo / "square_i32" / "1" / "model.py").write_text(SQUARE_PY)
    (repo / "square_i32" / "config.pbtxt").write_text('''name: "square_i32"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''')
    (repo / "fan_ensemble" / "1").mkdir(parents=True)
    (repo / "fan_ensemble" / "config.pbtxt").write_text('''name: "fan_ensemble"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "streamer" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "v" } },
  { model_name: "square_i32" model_version: -1 input_map { key: "IN" value: "v" } output_map { key: "OUT" value: "OUT" } }
] }
''')


def acc_ensemble(repo: Path) -> None:
    """An ensemble over the accumulator: sequence ids and flags pass to the step."""
    (repo / "acc_ensemble" / "1").mkdir(parents=True)
    (repo / "acc_ensemble" / "config.pbtxt").write_text('''name: "acc_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "accumulator" model_version: -1
  input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "SUM" } } ] }
''')


def slow_echo_markers(repo: Path) -> Path:
    """Where slow_echo leaves its fault-model markers (`started`: one line per batch begun)."""
    return repo.parent / "slow_echo-markers"


def streaming_repository(dest: Path) -> Path:
    """toy_llm, accumulator (direct) and its variants, the decoupled test model, a BLS caller,
    an ensemble of toy_llm and one where the decoupled model feeds a step, and a slow
    one-at-a-time model (slow_echo)."""
    repo = build_example_repository(dest, ("toy_llm", "accumulator"))
    accumulator(repo, "acc_oldest", strategy="oldest { max_candidate_sequences: 16 preferred_batch_size: [ 4 ] }")
    accumulator(repo, "acc_two", max_batch_size=2, count=2)
    accumulator(repo, "acc_one", max_batch_size=1, idle_us=400_000)
    accumulator(repo, "acc_pad", max_batch_size=2)
    stream_model(repo)
    bls_llm(repo)
    llm_ensemble(repo)
    fan_ensemble(repo)
    acc_ensemble(repo)
    markers = slow_echo_markers(repo)
    markers.mkdir()
    add_fault_model(repo, "slow_echo", max_batch=1, dims="1", batching=None,
                    params={"sleep_ms": 1000, "marker_dir": markers})
    return repo
