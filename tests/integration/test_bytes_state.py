"""A BYTES (TYPE_STRING) implicit state, as Triton holds one (qa/L0_sequence_batcher with
IMPLICIT_STATE=1 runs its `object` models): it starts as empty strings, or as the initial_state
file's serialized strings, each step's state output is the next step's state input, and
sequences do not see each other's."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import TritondServer, serving

CONFIG = """
backend: "python"
max_batch_size: 0
input [{{ name: "WORD" data_type: TYPE_STRING dims: [1] }}]
output [{{ name: "TEXT" data_type: TYPE_STRING dims: [1] }}]
instance_group [{{ kind: KIND_CPU count: 2 }}]
sequence_batching {{
  state [{{ input_name: "TEXT_IN" output_name: "TEXT_OUT" data_type: TYPE_STRING dims: [1] {initial} }}]
}}
"""

MODEL = """
import numpy as np
import pytest
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Appends each word to the sequence's text (its implicit state).\"\"\"

    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT_IN").as_numpy()[0]
            word = pb_utils.get_input_tensor_by_name(r, "WORD").as_numpy()[0]
            joined = np.array([text + word], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", joined), pb_utils.Tensor("TEXT_OUT", joined)]))
        return out
"""


def _step(client, model: str, seq: int, word: bytes, start: bool = False, end: bool = False) -> bytes:
    inp = grpcclient.InferInput("WORD", [1], "BYTES")
    inp.set_data_from_numpy(np.array([word], dtype=object))
    result = client.infer(model, [inp], sequence_id=seq, sequence_start=start, sequence_end=end)
    return result.as_numpy("TEXT")[0]


def test_a_string_state_carries_each_sequences_text(tmp_path):
    for name, initial in (("words", ""), ("greeting", 'initial_state { name: "hi" data_type: TYPE_STRING dims: [1] '
                                                      'data_file: "hi.bin" }')):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(initial=initial))
        (tmp_path / name / "1" / "model.py").write_text(MODEL)
    (tmp_path / "greeting" / "initial_state").mkdir()
    (tmp_path / "greeting" / "initial_state" / "hi.bin").write_bytes(struct.pack("<I", 3) + b"hi ")
    with serving(TritondServer(tmp_path)) as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        assert _step(client, "words", 1, b"a", start=True) == b"a"
        assert _step(client, "words", 2, b"x", start=True) == b"x"
        assert _step(client, "words", 1, b"b") == b"ab"
        assert _step(client, "words", 2, b"y", end=True) == b"xy"
        assert _step(client, "words", 1, b"c", end=True) == b"abc"
        assert _step(client, "words", 1, b"z", start=True, end=True) == b"z", "a new sequence starts empty"
        assert _step(client, "greeting", 3, b"there", start=True, end=True) == b"hi there"
        client.close()


TORCH_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 0
input [{ name: "INPUT__0" data_type: TYPE_STRING dims: [1] }]
output [{ name: "OUTPUT__0" data_type: TYPE_STRING dims: [1] }]
sequence_batching {
  state [{ input_name: "INPUT_STATE__1" output_name: "OUTPUT_STATE__1" data_type: TYPE_STRING dims: [1] }]
}
"""


def test_a_torchscript_model_gets_and_returns_its_string_state_as_lists(tmp_path):
    torch = pytest.importorskip("torch")
    from typing import List, Tuple

    class Join(torch.nn.Module):
        def forward(self, words: List[str], text: List[str]) -> Tuple[List[str], List[str]]:
            joined = [text[0] + words[0]]
            return joined, joined

    (tmp_path / "join" / "1").mkdir(parents=True)
    (tmp_path / "join" / "config.pbtxt").write_text(TORCH_CONFIG)
    torch.jit.save(torch.jit.script(Join()), str(tmp_path / "join" / "1" / "model.pt"))
    with serving(TritondServer(tmp_path)) as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        outs = []
        for i, word in enumerate([b"a", b"b", b"c"]):
            inp = grpcclient.InferInput("INPUT__0", [1], "BYTES")
            inp.set_data_from_numpy(np.array([word], dtype=object))
            result = client.infer("join", [inp], sequence_id=5, sequence_start=i == 0, sequence_end=i == 2)
            outs.append(result.as_numpy("OUTPUT__0")[0])
        client.close()
    assert outs == [b"a", b"ab", b"abc"]
