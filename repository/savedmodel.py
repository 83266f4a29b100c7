"""Reading a SavedModel's signatures from `saved_model.pb` without importing TensorFlow.

The broker and the frontends must never import TensorFlow (it takes seconds and hundreds
of megabytes), yet auto-complete and config checks need each signature's tensors. So the
few messages of TensorFlow's `saved_model.proto` that carry them are declared here by
field number and the file is parsed by protobuf itself; every other field is skipped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVE_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
# Signatures a SavedModel carries for its own bookkeeping, never served.
RESERVED_SIGNATURES = ("__saved_model_init_op", "__saved_model_train_op")

# tensorflow/core/framework/types.proto DataType values -> Triton config types
# (as Triton's TensorFlow backend maps them; other types cannot be served).
DTYPE_CONFIG: dict[int, str] = {
    1: "TYPE_FP32", 2: "TYPE_FP64", 3: "TYPE_INT32", 4: "TYPE_UINT8", 5: "TYPE_INT16", 6: "TYPE_INT8",
    7: "TYPE_STRING", 9: "TYPE_INT64", 10: "TYPE_BOOL", 17: "TYPE_UINT16", 19: "TYPE_FP16",
    22: "TYPE_UINT32", 23: "TYPE_UINT64",
}
DTYPE_NAMES: dict[int, str] = {8: "DT_COMPLEX64", 14: "DT_BFLOAT16", 18: "DT_COMPLEX128", 20: "DT_RESOURCE",
                               21: "DT_VARIANT"}

_F = descriptor_pb2.FieldDescriptorProto


@dataclass
class SignatureTensor:
    """One signature input or output: `key` is the name Triton configs use, `tensor` the graph
    tensor behind it; `dims` is None when the rank is unknown, -1 marks a free dimension."""

    key: str
    tensor: str
    dtype: int
    dims: list[int] | None

    @property
    def config_type(self) -> str:
        return DTYPE_CONFIG.get(self.dtype, "TYPE_INVALID")

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"DataType {self.dtype}")


@dataclass
class Signature:
    name: str
    inputs: list[SignatureTensor]
    outputs: list[SignatureTensor]


def _message(name: str, fields: list[tuple[str, int, int, int, str]], nested: list[Any] = ()) -> Any:
    msg = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, ftype, label, type_name in fields:
        field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = type_name
    msg.nested_type.extend(nested)
    return msg


def _map_entry(name: str, value_type: str) -> Any:
    entry = _message(name, [("key", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
                            ("value", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, value_type)])
    entry.options.map_entry = True
    return entry


@lru_cache(maxsize=1)
def _saved_model_class() -> Any:
    """The SavedModel message, reduced to signatures and tags, in a private descriptor pool."""
    pkg = ".tritond_savedmodel."
    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    file = descriptor_pb2.FileDescriptorProto(name="tritond_savedmodel.proto", package=pkg[1:-1], syntax="proto3")
    file.message_type.extend([
        _message("Dim", [("size", 1, _F.TYPE_INT64, opt, ""), ("name", 2, _F.TYPE_STRING, opt, "")]),
        _message("Shape", [("dim", 2, _F.TYPE_MESSAGE, rep, pkg + "Dim"),
                           ("unknown_rank", 3, _F.TYPE_BOOL, opt, "")]),
        _message("TensorInfo", [("name", 1, _F.TYPE_STRING, opt, ""), ("dtype", 2, _F.TYPE_INT32, opt, ""),
                                ("tensor_shape", 3, _F.TYPE_MESSAGE, opt, pkg + "Shape")]),
        _message("SignatureDef", [("inputs", 1, _F.TYPE_MESSAGE, rep, pkg + "SignatureDef.InputsEntry"),
                                  ("outputs", 2, _F.TYPE_MESSAGE, rep, pkg + "SignatureDef.OutputsEntry")],
                 [_map_entry("InputsEntry", pkg + "TensorInfo"), _map_entry("OutputsEntry", pkg + "TensorInfo")]),
        _message("MetaInfoDef", [("tags", 4, _F.TYPE_STRING, rep, "")]),
        _message("MetaGraphDef", [("meta_info_def", 1, _F.TYPE_MESSAGE, opt, pkg + "MetaInfoDef"),
                                  ("signature_def", 5, _F.TYPE_MESSAGE, rep, pkg + "MetaGraphDef.SignatureDefEntry")],
                 [_map_entry("SignatureDefEntry", pkg + "SignatureDef")]),
        _message("SavedModel", [("meta_graphs", 2, _F.TYPE_MESSAGE, rep, pkg + "MetaGraphDef")]),
    ])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(pkg[1:] + "SavedModel"))


def select_signature(available: list[str], configured: str) -> str | None:
    """Triton's choice: the configured signature, else `serving_default`, else (nothing
    configured) the first signature that is not a reserved one; None when none fits."""
    if configured:
        return configured if configured in available else None
    if DEFAULT_SIGNATURE in available:
        return DEFAULT_SIGNATURE
    usable = sorted(k for k in available if k not in RESERVED_SIGNATURES)
    return usable[0] if usable else None


def _tensors(entries) -> list[SignatureTensor]:
    out = []
    for key in sorted(entries):
        info = entries[key]
        shape = info.tensor_shape
        dims = None if shape.unknown_rank else [int(d.size) for d in shape.dim]
        out.append(SignatureTensor(key, info.name, int(info.dtype), dims))
    return out


def read_signature(path: str, tag: str = "", signature: str = "") -> Signature:
    """The signature a model directory `path` serves under `tag` (default `serve`) and
    `signature` (default as `select_signature`). Raises ValueError saying what is missing."""
    pb = os.path.join(path, "saved_model.pb")
    if not os.path.isfile(pb):
        if os.path.isfile(os.path.join(path, "saved_model.pbtxt")):
            raise ValueError(f"'{path}' holds saved_model.pbtxt; tritond reads binary SavedModels "
                             "(saved_model.pb) only")
        raise ValueError(f"'{path}' is not a SavedModel directory: it has no saved_model.pb")
    saved = _saved_model_class()()
    with open(pb, "rb") as f:
        saved.ParseFromString(f.read())
    tag = tag or SERVE_TAG
    graphs = [g for g in saved.meta_graphs if tag in g.meta_info_def.tags]
    if not graphs:
        found = sorted({t for g in saved.meta_graphs for t in g.meta_info_def.tags})
        raise ValueError(f"the SavedModel has no graph tagged '{tag}' (tags: {', '.join(found) or 'none'})")
    defs = graphs[0].signature_def
    chosen = select_signature(list(defs), signature)
    if chosen is None:
        wanted = signature or DEFAULT_SIGNATURE
        raise ValueError(f"the SavedModel has no '{wanted}' signature (signatures: {', '.join(sorted(defs)) or 'none'})")
    return Signature(chosen, _tensors(defs[chosen].inputs), _tensors(defs[chosen].outputs))
