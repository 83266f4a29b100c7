"""The ONNX Runtime backend's auto-complete, done from the graph without loading onnxruntime.

Triton lets an ONNX model run with little or no config: inputs, outputs and the
batch size come from the graph, and whatever the config does state must agree
with it. Doing this while scanning the repository puts a mismatch in the model's
load error instead of in a worker crash.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from tritonclient.grpc import model_config_pb2

from .errors import ConfigError

DataType = model_config_pb2.DataType

# ONNX TensorProto element type names whose config name is not just TYPE_<name>.
_ONNX_TYPE_RENAMES = {
    "FLOAT": "TYPE_FP32",
    "FLOAT16": "TYPE_FP16",
    "DOUBLE": "TYPE_FP64",
    "BFLOAT16": "TYPE_BF16",
}
_PLAIN_ONNX_TYPES = {"BOOL", "STRING", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}


@dataclass
class GraphTensor:
    """A graph input or output; `dims` is None when the graph records no shape, -1 marks a free dim."""

    name: str
    data_type: int
    dims: list[int] | None


def _config_type(elem_type_name: str) -> int:
    if elem_type_name in _ONNX_TYPE_RENAMES:
        return DataType.Value(_ONNX_TYPE_RENAMES[elem_type_name])
    if elem_type_name in _PLAIN_ONNX_TYPES:
        return DataType.Value("TYPE_" + elem_type_name)
    return DataType.TYPE_INVALID


def read_graph_io(path: str) -> tuple[list[GraphTensor], list[GraphTensor], list[GraphTensor]]:
    """Inputs (initializers excluded), outputs and overridable initializers (graph inputs that have
    an initializer, which a request may feed) of an ONNX file, or of `<dir>/model.onnx`."""
    import onnx

    if os.path.isdir(path):
        path = os.path.join(path, "model.onnx")
    graph = onnx.load(path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def tensor(value) -> GraphTensor:
        if not value.type.HasField("tensor_type"):
            return GraphTensor(value.name, DataType.TYPE_INVALID, None)
        tt = value.type.tensor_type
        dtype = _config_type(onnx.TensorProto.DataType.Name(tt.elem_type))
        if not tt.HasField("shape"):
            return GraphTensor(value.name, dtype, None)
        return GraphTensor(value.name, dtype, [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim])

    inputs = [tensor(v) for v in graph.input if v.name not in initializers]
    overridable = [tensor(v) for v in graph.input if v.name in initializers]
    return inputs, [tensor(v) for v in graph.output], overridable


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _config_dims(t: GraphTensor, max_batch_size: int) -> tuple[list[int], bool]:
    """Config dims for a graph tensor and whether it needs an empty reshape (per-batch scalar)."""
    if t.dims is None:
        return [-1], False
    dims = t.dims[1:] if max_batch_size > 0 else list(t.dims)
    if dims:
        return dims, False
    return [1], max_batch_size > 0


def _fill(io, t: GraphTensor, max_batch_size: int) -> None:
    dims, scalar = _config_dims(t, max_batch_size)
    io.dims.extend(dims)
    if scalar and not io.HasField("reshape"):
        io.reshape.SetInParent()


def _complete_max_batch(cfg, tensors: list[GraphTensor], default_max_batch_size: int, fail: Callable) -> None:
    can_batch = all(t.dims and t.dims[0] == -1 for t in tensors)
    if not can_batch:
        if cfg.max_batch_size != 0:
            raise fail(
                "max_batch_size",
                f"autofill failed for model '{cfg.name}': model does not support batching while non-zero "
                "max_batch_size is specified",
            )
        return
    if cfg.max_batch_size == 0:
        cfg.max_batch_size = max(default_max_batch_size, 0)
    if cfg.max_batch_size > 1 and cfg.WhichOneof("scheduling_choice") is None:
        cfg.dynamic_batching.SetInParent()


def _check_dims(cfg, io, kind: str, t: GraphTensor, field: str, fail: Callable) -> None:
    if t.dims is None:
        if kind == "output":
            return      # ONNX Runtime infers an output's shape when it loads the graph
        # ONNX Runtime reports an input declared without a shape as a scalar, and so checks it.
        t = GraphTensor(t.name, t.data_type, [])
    if kind == "input" and io.allow_ragged_batch:
        # The backend hands a ragged input over as the batch's elements in one 1-D tensor.
        if t.dims != [-1]:
            raise fail(field, f"unable to load model '{cfg.name}', configuration expects model provides input "
                              f"with shape [-1]  for ragged input '{io.name}', model provides {_shape(t.dims)}")
        return
    if kind == "output" and any(io.name in b.target_name for b in cfg.batch_output):
        return          # a batch output's shape comes from its source input, not the model
    configured = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    if not t.dims:
        if any(d != 1 for d in configured):
            raise fail(
                field,
                f"unable to load model '{cfg.name}', scalar tensor '{io.name}', should only provide 1 in the "
                f"model configuration when the model doesn't support batching. Model configuration provided: "
                f"{_shape(configured)}.",
            )
        return
    full = ([-1] + configured) if cfg.max_batch_size > 0 else configured
    if cfg.max_batch_size > 0 and t.dims[0] != -1:
        raise fail(
            field,
            f"{kind} '{io.name}': max_batch_size > 0 needs the model's first dimension to be -1, "
            f"but the model expects {_shape(t.dims)}",
        )
    ok = len(full) == len(t.dims) and all(m == -1 or m == c for m, c in zip(t.dims, full))
    if not ok:      # the ONNX Runtime backend's words
        specified = (f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 followed by "
                     f"the explicit tensor shape, making complete shape {_shape(full)})" if cfg.max_batch_size > 0
                     else f"{len(full)} dimensions (shape {_shape(full)})")
        raise fail(
            field,
            f"model '{cfg.name}', tensor '{io.name}': the model expects {len(t.dims)} dimensions (shape "
            f"{_shape(t.dims)}) but the model configuration specifies {specified}",
        )


def _check_entries(cfg, entries, tensors: list[GraphTensor], kind: str, fail: Callable) -> None:
    """Fill an entry's missing data_type/dims from the graph, then require agreement."""
    by_name = {t.name: t for t in tensors}
    for i, io in enumerate(entries):
        t = by_name.get(io.name)
        if t is None:
            allowed = ", ".join(sorted(by_name))
            raise fail(f"{kind}[{i}].name", f"unexpected inference {kind} '{io.name}', allowed {kind}s are: {allowed}")
        if t.data_type == DataType.TYPE_INVALID:
            raise fail(f"{kind}[{i}].data_type", f"{kind} '{io.name}' has an ONNX type tritond does not support")
        if io.data_type == DataType.TYPE_INVALID:
            io.data_type = t.data_type
        elif io.data_type != t.data_type:
            raise fail(
                f"{kind}[{i}].data_type",
                f"configuration expects datatype {DataType.Name(io.data_type)} for {kind} '{io.name}', "
                f"model provides {DataType.Name(t.data_type)}",
            )
        if not io.dims:
            _fill(io, t, cfg.max_batch_size)
        _check_dims(cfg, io, kind, t, f"{kind}[{i}].dims", fail)


def autocomplete_onnx(
    cfg: model_config_pb2.ModelConfig, model_file: str, config_file: str, default_max_batch_size: int
) -> None:
    """Complete `cfg` from the ONNX graph at `model_file` (which must exist) and check what it states.

    As Triton's ONNX Runtime backend: when the config lists both inputs and
    outputs nothing is added; otherwise max_batch_size (and `dynamic_batching {}`)
    and the missing list are taken from the graph. Raises ConfigError.
    """

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(cfg.name, config_file, field, message)

    if cfg.max_batch_size < 0:
        raise fail("max_batch_size", "'max_batch_size' must be non-negative value")
    try:
        inputs, outputs, overridable = read_graph_io(model_file)
    except Exception as e:  # onnx raises DecodeError, ValueError, OSError... for a bad file
        raise ConfigError(cfg.name, model_file, "default_model_filename", f"cannot read ONNX model: {e}") from e

    if not ((len(cfg.input) + len(cfg.batch_input)) and cfg.output):
        _complete_max_batch(cfg, inputs + outputs, default_max_batch_size, fail)
        for entries, tensors in ((cfg.input, inputs), (cfg.output, outputs)):
            if not entries:
                for t in tensors:
                    entries.add(name=t.name, data_type=t.data_type)
    # As the ONNX Runtime backend: a sequence model's control inputs and implicit states are
    # model inputs too, fed by the sequence batcher rather than listed under `input`; the counts
    # must agree before the names are compared.
    seq = cfg.sequence_batching
    sequence_inputs = [ci.name for ci in seq.control_input] + [s.input_name for s in seq.state]
    expected = len(cfg.input) + len(cfg.batch_input) + len(sequence_inputs)
    # As the ONNX Runtime backend: the overridable initializers count as inputs the config may list
    if expected > len(inputs) + len(overridable):
        raise fail("input", f"unable to load model '{cfg.name}', configuration expects {expected} inputs, model "
                            f"provides {len(inputs) + len(overridable)}")
    _check_entries(cfg, cfg.input, inputs + overridable, "input", fail)
    _check_entries(cfg, cfg.output, outputs, "output", fail)

    configured = ({io.name for io in cfg.input} | {name for b in cfg.batch_input for name in b.target_name}
                  | set(sequence_inputs))
    missing = [t.name for t in inputs if t.name not in configured]
    if missing:
        raise fail(
            "input",
            f"unable to load model '{cfg.name}', configuration expects {expected} inputs, model provides "
            f"{len(inputs)}; not configured: {', '.join(missing)}",
        )
