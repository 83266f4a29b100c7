"""OpenVINO and SavedModel configs in the repository layer: the IR reader agrees with OpenVINO,
auto-complete follows Triton's backends, and every bad config is a located ConfigError.
SavedModels are written here with the reader's own schema, so no TensorFlow is needed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tritond.options import UsageError, _backend_config
from tritond.repository.config import load_model_config
from tritond.repository.errors import ConfigError
from tritond.repository.layout import ModelSource
from tritond.repository.openvino_autocomplete import read_ir_io
from tritond.repository.savedmodel import _saved_model_class, read_signature

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def source(tmp_path: Path, name: str, config: str | None) -> tuple[ModelSource, Path]:
    (tmp_path / name / "1").mkdir(parents=True)
    if config is not None:
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return ModelSource(name, str(tmp_path / name), str(tmp_path)), tmp_path / name / "1"


# ------------------------------------------------------------------ OpenVINO

def write_ir(path: Path, layout: bool, batch: int = -1) -> None:
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([batch, 8], ov.Type.f32, name="x")
    x.output(0).set_names({"x", "alias"})
    y = ops.add(x, ops.constant(np.ones((1, 8), np.float32)))
    result = ops.result(y)
    result.output(0).set_names({"y"})
    if layout:
        x.set_layout(ov.Layout("N?"))
        result.set_layout(ov.Layout("N?"))
    ov.save_model(ov.Model([result], [x], "m"), str(path))


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_ir_reader_agrees_with_openvino(tmp_path):
    import openvino as ov

    write_ir(tmp_path / "m.xml", layout=True)
    inputs, outputs, weights = read_ir_io(str(tmp_path / "m.xml"))
    model = ov.Core().read_model(str(tmp_path / "m.xml"))
    for ours, theirs in ((inputs, model.inputs), (outputs, model.outputs)):
        assert [(t.name, set(t.names)) for t in ours] == [(p.get_any_name(), p.get_names()) for p in theirs]
        assert [t.dims for t in ours] == [[d.get_length() if d.is_static else -1 for d in p.get_partial_shape()]
                                          for p in theirs]
    assert all(t.has_batch and t.config_type == "TYPE_FP32" for t in inputs + outputs) and weights


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
@pytest.mark.parametrize("layout,max_batch,dims", [(True, 4, [8]), (False, 0, [-1, 8])])
def test_openvino_batching_is_filled_only_with_a_batch_layout(tmp_path, layout, max_batch, dims):
    src, version = source(tmp_path, "m", None)
    write_ir(version / "model.xml", layout)
    cfg = load_model_config(src)
    assert (cfg.backend, cfg.max_batch_size, cfg.HasField("dynamic_batching")) == ("openvino", max_batch, layout)
    assert [(io.name, list(io.dims)) for io in (*cfg.input, *cfg.output)] == [("alias", dims), ("y", dims)]


IO = 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 8 ] } ]\n'


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
@pytest.mark.parametrize("extra,field,text", [
    (param("NUM_STREAMS", "lots"), "parameters.NUM_STREAMS", "AUTO/NUMA/<int_value>"),
    (param("PERFORMANCE_HINT", "fast"), "parameters.PERFORMANCE_HINT", "LATENCY/THROUGHPUT"),
    (param("INFERENCE_NUM_THREADS", "-1"), "parameters.INFERENCE_NUM_THREADS", "non-negative number"),
    (param("SKIP_OV_DYNAMIC_BATCHSIZE", "1"), "parameters.SKIP_OV_DYNAMIC_BATCHSIZE", "YES or NO"),
    (param("HINT_BF16", "NO"), "parameters.HINT_BF16", "to be YES"),
    (param("CPU_EXTENSION_PATH", "/nonexistent.so"), "parameters.CPU_EXTENSION_PATH", "does not exist"),
    ("instance_group [ { kind: KIND_MODEL } ]", "instance_group[0].kind", "only Kind CPU and AUTO"),
    ("", "", ""),
])
def test_openvino_parameters_are_checked(tmp_path, extra, field, text):
    src, version = source(tmp_path, "m", 'backend: "openvino"\nmax_batch_size: 4\n' + IO + extra)
    write_ir(version / "model.xml", layout=False)
    if not field:
        load_model_config(src)
        return
    with pytest.raises(ConfigError) as e:
        load_model_config(src, autocomplete=False)
    assert e.value.field == field and text in e.value.message


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_openvino_output_dims_must_match_and_reshape_skips_the_check(tmp_path):
    bad = IO.replace('"y" data_type: TYPE_FP32 dims: [ 8 ]', '"y" data_type: TYPE_FP32 dims: [ -1 ]')
    src, version = source(tmp_path, "m", 'backend: "openvino"\nmax_batch_size: 4\n' + bad)
    write_ir(version / "model.xml", layout=False, batch=2)
    with pytest.raises(ConfigError, match="the model expects 2 dimensions") as e:
        load_model_config(src)
    assert e.value.field == "output[0].dims"


# ------------------------------------------------------------------ SavedModel

def write_savedmodel(directory: Path, signatures: dict, tags=("serve",)) -> None:
    """A saved_model.pb holding one graph; signatures: name -> (inputs, outputs), each
    {key: (dtype enum, dims or None)}."""
    saved = _saved_model_class()()
    graph = saved.meta_graphs.add()
    graph.meta_info_def.tags.extend(tags)
    for name, (inputs, outputs) in signatures.items():
        for target, tensors in ((graph.signature_def[name].inputs, inputs), (graph.signature_def[name].outputs, outputs)):
            for key, (dtype, dims) in tensors.items():
                info = target[key]
                info.name, info.dtype = f"{key}:0", dtype
                if dims is None:
                    info.tensor_shape.unknown_rank = True
                for d in dims or []:
                    info.tensor_shape.dim.add(size=d)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "saved_model.pb").write_bytes(saved.SerializeToString())


FP32, STRING, BF16 = 1, 7, 14
MLP = {"serving_default": ({"INPUT0": (FP32, [-1, 16])}, {"OUTPUT0": (FP32, [-1, 16])})}


def savedmodel(tmp_path: Path, config: str | None, signatures=MLP, **kw) -> ModelSource:
    src, version = source(tmp_path, "m", config)
    write_savedmodel(version / "model.savedmodel", signatures, **kw)
    return src


def test_signature_choice_skips_reserved_ones(tmp_path):
    write_savedmodel(tmp_path, {"__saved_model_init_op": ({}, {}), "predict": MLP["serving_default"]})
    assert read_signature(str(tmp_path)).name == "predict"


def test_savedmodel_auto_complete_batches_and_fills(tmp_path):
    cfg = load_model_config(savedmodel(tmp_path, None))
    assert (cfg.platform, cfg.backend, cfg.max_batch_size) == ("tensorflow_savedmodel", "tensorflow", 4)
    assert cfg.HasField("dynamic_batching")
    assert [(io.name, list(io.dims)) for io in (*cfg.input, *cfg.output)] == [("INPUT0", [16]), ("OUTPUT0", [16])]


def test_savedmodel_partial_config_is_completed(tmp_path):
    sigs = {"serving_default": ({"a": (FP32, [-1, 2]), "b": (STRING, [-1])}, MLP["serving_default"][1])}
    cfg = load_model_config(savedmodel(tmp_path, 'platform: "tensorflow_savedmodel"\ninput [ { name: "b" } ]', sigs))
    assert [(io.name, list(io.dims), io.HasField("reshape")) for io in cfg.input] == [("b", [1], True), ("a", [2], False)]
    assert cfg.max_batch_size == 4


@pytest.mark.parametrize("config,sigs,kw,field,text", [
    ('max_batch_size: 4', {"serving_default": ({"x": (FP32, [2, 16])}, {"y": (FP32, [2, 16])})}, {},
     "max_batch_size", "does not support batching"),
    ('', {"serving_default": ({"x": (FP32, None)}, {"y": (FP32, [-1])})}, {}, "input[0].dims", "rank of model tensor"),
    ('', {"serving_default": ({"x": (BF16, [-1])}, {"y": (FP32, [-1])})}, {}, "input", "DT_BFLOAT16"),
    ('', MLP, {"tags": ("train",)}, "parameters.TF_GRAPH_TAG", "no graph tagged 'serve'"),
    (param("TF_NUM_INTRA_THREADS", "-2"), MLP, {}, "parameters.TF_NUM_INTRA_THREADS", "non-negative"),
    (param("TF_INIT_OPS_FILE", "init.json"), MLP, {}, "parameters.TF_INIT_OPS_FILE", "not supported"),
    ("optimization { graph { level: 1 } }", MLP, {}, "optimization.graph.level", "XLA"),
    ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "extra" data_type: TYPE_FP32 '
     'dims: [ 1 ] } ]', MLP, {}, "input[1].name", "unexpected inference input 'extra'"),
])
def test_savedmodel_errors_are_located(tmp_path, config, sigs, kw, field, text):
    with pytest.raises(ConfigError) as e:
        load_model_config(savedmodel(tmp_path, 'platform: "tensorflow_savedmodel"\n' + config, sigs, **kw))
    assert e.value.field == field and text in e.value.message, str(e.value)


# ------------------------------------------------------------------ --backend-config

def test_backend_config_defaults_and_refusals():
    assert _backend_config(["default-max-batch-size=8", "openvino,default-max-batch-size=2",
                            "tensorflow,version=2", "tensorflow,allow-soft-placement=true"]) == \
        {"": 8, "openvino": 2}
    for bad in ("tensorflow,gpu-memory-fraction=0.5", "tensorflow,version=1", "openvino,threads=2",
                "onnxruntime,default-max-batch-size=x"):
        with pytest.raises(UsageError):
            _backend_config([bad])
