"""Classification results carry the output's labels (label_filename, read when the model
loads), also through ensembles; a label file must be readable and inside the model."""
from __future__ import annotations

import numpy as np
import pytest

from tritond.frontend.classification import classify, output_labels
from tritond.repository import devices
from tritond.repository.catalog import load_spec
from tritond.repository.datatypes import deserialize_bytes
from tritond.repository.layout import ModelSource
from tritond.repository.view import model_view, read_labels
from tritond.wire import schema as S
from tritond.wire.errors import invalid


def test_top_k_strings_carry_labels_where_the_file_has_them():
    arr = np.array([[1.0, 16.0, 3.0], [9.0, 2.0, 5.0]], np.float32)
    shape, data = classify("FP32", arr, 2, True, ["zero", "one"])
    assert shape == [2, 2]
    assert list(deserialize_bytes(data)) == [b"16.000000:1:one", b"3.000000:2",
                                             b"9.000000:0:zero", b"5.000000:2"]


def test_labels_are_the_files_lines(tmp_path):
    (tmp_path / "labels.txt").write_text("a\r\nb\n\nd\n")
    assert read_labels(str(tmp_path), "labels.txt") == ["a", "b", "", "d"]
    view = model_view({"output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4],
                                   "label_filename": "labels.txt"}]}, str(tmp_path))
    assert view.outputs["y"].labels == ["a", "b", "", "d"]


def _entry(name: str, config: dict, labels: list[str] | None = None) -> S.ModelEntry:
    view = model_view(config)
    if labels is not None:
        view.outputs["OUT"].labels = labels
    return S.ModelEntry(name, 1, S.ModelState.READY, view=view, config=config)


def _ensemble(name: str, step_model: str, step_output: str = "Y") -> dict:
    return {"platform": "ensemble", "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
            "ensemble_scheduling": {"step": [{"model_name": step_model, "model_version": "-1",
                                              "output_map": {step_output: "OUT"}}]}}


def test_an_ensemble_output_takes_the_labels_of_the_model_producing_it_unless_it_has_its_own():
    plain = {"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}
    inner = S.ModelEntry("inner", 1, S.ModelState.READY, view=model_view(plain), config=plain)
    inner.view.outputs["Y"].labels = ["from_inner"]
    nested = _entry("nested", _ensemble("nested", "inner"))
    outer = _entry("outer", _ensemble("outer", "nested", "OUT"))
    override = _entry("override", _ensemble("override", "inner"), ["own"])
    table = {"inner": inner, "nested": nested}

    def resolve(name: str, version: int) -> S.ModelEntry:
        if name not in table:
            raise invalid(f"Request for unknown model: '{name}' is not found")
        return table[name]
    assert output_labels(resolve, outer, "OUT") == ["from_inner"]
    assert output_labels(resolve, override, "OUT") == ["own"]
    assert output_labels(resolve, _entry("gone", _ensemble("gone", "missing")), "OUT") == []


BASE = ('backend: "identity" max_batch_size: 4 '
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }] ')


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)


@pytest.mark.parametrize("label_file, error", [
    ("missing.txt", "field 'output[0].label_filename': unable to read label file 'missing.txt'"),
    ("../outside.txt", "field 'output[0].label_filename': '../outside.txt' must name a file inside the "
                       "model's directory"),
])
def test_a_label_file_that_cannot_be_read_or_leaves_the_model_fails_the_load(tmp_path, label_file, error):
    path = tmp_path / "m"
    (path / "1").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("secret\n")
    (path / "config.pbtxt").write_text(
        BASE + f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] label_filename: "{label_file}" }}]')
    assert error in load_spec(ModelSource("m", str(path), str(tmp_path))).error
