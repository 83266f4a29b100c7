"""The OpenVINO backend's auto-complete, parameter and shape checks, without loading OpenVINO.

An IR's inputs and outputs are read from `model.xml` (its Parameter and Result layers), an
ONNX file's from its graph, so the broker checks a config before any worker starts and a
mismatch is a located error. As Triton's OpenVINO backend: inputs and outputs are completed
only when the config lists none; `max_batch_size` (and `dynamic_batching {}`) is filled only
when every input and output has a layout with a batch dimension `N`. Unlike Triton's
backend, a dimension is written as -1 only where the model leaves that dimension free.
"""
from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Callable

from tritonclient.grpc import model_config_pb2

from .errors import ConfigError
from .onnx_autocomplete import read_graph_io
from .parameters import int_parameter, parameter_text

DataType = model_config_pb2.DataType
Fail = Callable[[str, str], ConfigError]

# OpenVINO element types -> config types, as Triton's backend maps them.
ELEMENT_CONFIG = {
    "boolean": "TYPE_BOOL", "u8": "TYPE_UINT8", "u16": "TYPE_UINT16", "u32": "TYPE_UINT32", "u64": "TYPE_UINT64",
    "i8": "TYPE_INT8", "i16": "TYPE_INT16", "i32": "TYPE_INT32", "i64": "TYPE_INT64", "f16": "TYPE_FP16",
    "f32": "TYPE_FP32",
}
SUPPORTED_TYPES = frozenset(ELEMENT_CONFIG.values())

# Parameters of Triton's OpenVINO backend and the values each accepts.
YES_NO_PARAMETERS = ("SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS")
COUNT_PARAMETERS = ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS")
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
AUTOCOMPLETE_SUFFIXES = (".xml", ".onnx")


@dataclass
class ModelTensor:
    """A model input or output: its names, config type, dims (-1 free; None: rank unknown) and
    whether its layout marks a batch dimension."""

    name: str
    names: frozenset[str]
    config_type: str
    dims: list[int] | None
    has_batch: bool = False


def yes(cfg: model_config_pb2.ModelConfig, key: str) -> bool:
    return parameter_text(cfg, key).strip().upper() == "YES"


def _names(text: str) -> frozenset[str]:
    """A port's `names` attribute: comma-separated, with '\\,' for a comma inside a name."""
    parts = re.split(r"(?<!\\),", text) if text else []
    return frozenset(p.replace("\\,", ",").strip() for p in parts if p.strip())


def _dims(layer: ET.Element, port: ET.Element | None) -> list[int] | None:
    data = layer.find("data")
    shape = data.get("shape") if data is not None else None
    if shape is not None:
        if shape.strip() in ("...", "?..."):
            return None
        items = [s.strip() for s in shape.split(",") if s.strip()]
        return [int(s) if s.lstrip("-").isdigit() and int(s) >= 0 else -1 for s in items]
    if port is None:
        return None
    return [int(d.text) if int(d.text) >= 0 else -1 for d in port.findall("dim")]


def _layout_has_batch(element: ET.Element | None) -> bool:
    """Whether a port's layout (`[N,C,H,W]` or `NCHW`) names a batch dimension."""
    if element is None:
        return False
    for attribute in element.iter("attribute"):
        if attribute.get("name") == "layout":
            layout = attribute.get("layout", "").strip("[]").replace(" ", "")
            return "N" in (layout.split(",") if "," in layout else list(layout))
    return False


def read_ir_io(xml_path: str) -> tuple[list[ModelTensor], list[ModelTensor], bool]:
    """Inputs and outputs of an IR `model.xml`, and whether it has weights to read from its .bin."""
    root = ET.parse(xml_path).getroot()
    layers = {layer.get("id"): layer for layer in root.iter("layer")}
    edges = {(e.get("to-layer"), e.get("to-port")): (e.get("from-layer"), e.get("from-port"))
             for e in root.iter("edge")}
    inputs, outputs = [], []
    for layer in layers.values():
        kind = layer.get("type")
        if kind == "Parameter":
            port = layer.find("output/port")
            names = _names(port.get("names", "")) if port is not None else frozenset()
            names = names or frozenset([layer.get("name", "")])
            data = layer.find("data")
            element = data.get("element_type", "") if data is not None else ""
            inputs.append(ModelTensor(min(names), names, ELEMENT_CONFIG.get(element, "TYPE_INVALID"),
                                      _dims(layer, port), _layout_has_batch(port)))
        elif kind == "Result":
            port = layer.find("input/port")
            names = _names(layer.get("output_names", ""))
            source = edges.get((layer.get("id"), port.get("id") if port is not None else "0"))
            producer_port = None
            if source is not None and source[0] in layers:
                for p in layers[source[0]].findall("output/port"):
                    if p.get("id") == source[1]:
                        producer_port = p
            if not names and producer_port is not None:
                names = _names(producer_port.get("names", ""))
            if not names:
                raise ValueError(f"output layer '{layer.get('name')}' has no tensor name (OpenVINO models "
                                 "must name their outputs)")
            precision = (port.get("precision", "") if port is not None else "").lower()
            element = {"fp32": "f32", "fp16": "f16", "bool": "boolean"}.get(precision, precision)
            outputs.append(ModelTensor(min(names), names, ELEMENT_CONFIG.get(element, "TYPE_INVALID"),
                                       _dims(layer, port),
                                       _layout_has_batch(port) or _layout_has_batch(producer_port)))
    has_weights = any(int((layer.find("data").get("size", "0") if layer.find("data") is not None else "0")) > 0
                      for layer in layers.values() if layer.get("type") == "Const")
    return inputs, outputs, has_weights


def read_onnx_io(path: str) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """Inputs and outputs of an ONNX file as OpenVINO sees them (ONNX graphs carry no layout)."""
    inputs, outputs, _ = read_graph_io(path)
    return tuple([ModelTensor(t.name, frozenset([t.name]), DataType.Name(t.data_type), t.dims)
                  for t in tensors] for tensors in (inputs, outputs))


def check_parameters(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    """The values Triton's OpenVINO backend accepts; a misspelt switch is an error, not 'off'."""
    for key in YES_NO_PARAMETERS + ("HINT_BF16",):
        value = parameter_text(cfg, key).strip().upper()
        allowed = ("YES",) if key == "HINT_BF16" else ("YES", "NO")
        if value and value not in allowed:
            raise fail(f"parameters.{key}", f"expected the parameter '{key}' to be {' or '.join(allowed)}, "
                                            f"got {value}")
    for key in COUNT_PARAMETERS:
        text = parameter_text(cfg, key).strip()
        if text and not text.isdigit():
            raise fail(f"parameters.{key}", f"expected the parameter '{key}' to be a non-negative number, "
                                            f"got {text}")
    streams = parameter_text(cfg, "NUM_STREAMS").strip().upper()
    if streams and streams not in ("AUTO", "NUMA") and not streams.isdigit():
        raise fail("parameters.NUM_STREAMS", f"expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/"
                                             f"<int_value>, got {streams}")
    hint = parameter_text(cfg, "PERFORMANCE_HINT").strip().upper()
    if hint and hint not in PERFORMANCE_HINTS:
        raise fail("parameters.PERFORMANCE_HINT", "expected the parameter 'PERFORMANCE_HINT' to be "
                                                  f"{'/'.join(PERFORMANCE_HINTS)}, got {hint}")
    extension = parameter_text(cfg, "CPU_EXTENSION_PATH").strip()
    if extension and not os.path.isfile(extension):
        raise fail("parameters.CPU_EXTENSION_PATH", f"CPU extension library '{extension}' does not exist")
    int_parameter(cfg, "INFERENCE_NUM_THREADS", fail)
    kinds = model_config_pb2.ModelInstanceGroup.Kind
    for i, group in enumerate(cfg.instance_group):
        if group.kind not in (kinds.KIND_CPU, kinds.KIND_AUTO):
            raise fail(f"instance_group[{i}].kind", f"unable to load model '{cfg.name}', Triton OpenVINO backend "
                                                    "supports only Kind CPU and AUTO")
    for kind, entries in (("input", cfg.input), ("output", cfg.output)):
        for i, io in enumerate(entries):
            if DataType.Name(io.data_type) not in SUPPORTED_TYPES and io.data_type != DataType.TYPE_INVALID:
                raise fail(f"{kind}[{i}].data_type", f"unsupported datatype {DataType.Name(io.data_type)} for "
                                                     f"{kind} '{io.name}' for model '{cfg.name}'")


def _complete(cfg, inputs: list[ModelTensor], outputs: list[ModelTensor], default_max_batch_size: int) -> None:
    """Triton's AutoCompleteBatching and AutoCompleteInputOrOutput."""
    if all(t.has_batch for t in inputs + outputs) and inputs + outputs:
        if cfg.max_batch_size == 0:
            cfg.max_batch_size = max(default_max_batch_size, 1)
        if cfg.max_batch_size > 1 and cfg.WhichOneof("scheduling_choice") is None:
            cfg.dynamic_batching.SetInParent()
    for entries, tensors in ((cfg.input, inputs), (cfg.output, outputs)):
        if entries:
            continue
        for t in tensors:
            dims = t.dims if t.dims is not None else [-1]
            entries.add(name=t.name, data_type=DataType.Value(t.config_type) if t.config_type in SUPPORTED_TYPES
                        else DataType.TYPE_INVALID, dims=dims[1:] if cfg.max_batch_size > 0 else dims)


def _matches(model: int, config: int) -> bool:
    return model == -1 or model == config


def _check_tensors(cfg, entries, tensors: list[ModelTensor], kind: str, fail: Fail, compare: bool) -> None:
    by_name = {n: t for t in tensors for n in t.names}
    for i, io in enumerate(entries):
        t = by_name.get(io.name)
        if t is None:
            allowed = ", ".join(sorted(t.name for t in tensors))
            raise fail(f"{kind}[{i}].name", f"unexpected inference {kind} '{io.name}', allowed {kind}s are: {allowed}")
        if not compare or t.dims is None:
            continue
        dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        model = t.dims
        if cfg.max_batch_size > 0:
            if not model:
                raise fail(f"{kind}[{i}].dims", f"model '{cfg.name}', tensor '{io.name}': for the model to support "
                                                "batching the shape should have at least 1 dimension")
            model = model[1:]
        exact = kind == "output"
        ok = len(model) == len(dims) and all(
            _matches(m, c) if (exact or c != -1) else True for m, c in zip(model, dims))
        if exact and ok:
            ok = all(not (c == -1 and m != -1) for m, c in zip(model, dims))
        if not ok:
            shown = ([-1] if cfg.max_batch_size > 0 else []) + dims
            full = ([-1] if cfg.max_batch_size > 0 else []) + model
            raise fail(f"{kind}[{i}].dims", f"model '{cfg.name}', tensor '{io.name}': the model expects "
                                            f"{len(full)} dimensions (shape {full}) but the model configuration "
                                            f"specifies {len(shown)} dimensions (shape {shown})")


def autocomplete_openvino(
    cfg: model_config_pb2.ModelConfig, model_file: str, config_file: str, default_max_batch_size: int,
    fill: bool = True,
) -> None:
    """Check the parameters; for an IR or ONNX file, complete `cfg` from it (with `fill`) and
    check the configured inputs and outputs against it. Raises ConfigError."""

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(cfg.name, config_file, field, message)

    check_parameters(cfg, fail)
    if not model_file.endswith(AUTOCOMPLETE_SUFFIXES):
        return
    try:
        if model_file.endswith(".onnx"):
            inputs, outputs = read_onnx_io(model_file)
        else:
            inputs, outputs, has_weights = read_ir_io(model_file)
            weights = model_file[:-4] + ".bin"
            if has_weights and not os.path.isfile(weights):
                raise ValueError(f"its weights file '{os.path.basename(weights)}' is missing")
    except Exception as e:  # ParseError, DecodeError, ValueError, OSError: not a readable model
        raise ConfigError(cfg.name, model_file, "default_model_filename", f"cannot read OpenVINO model: {e}") from None
    if fill:
        _complete(cfg, inputs, outputs, default_max_batch_size)
    if len(cfg.input) != len(inputs):
        raise fail("input", f"unable to load model '{cfg.name}', configuration expects {len(cfg.input)} inputs, "
                            f"model provides {len(inputs)}")
    reshaped = yes(cfg, "RESHAPE_IO_LAYERS")
    _check_tensors(cfg, cfg.input, inputs, "input", fail, compare=not reshaped)
    _check_tensors(cfg, cfg.output, outputs, "output", fail, compare=not reshaped)
