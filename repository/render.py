"""ModelConfig as clients see it: Triton's config JSON, tensor metadata, platform name.

Triton renders configs with protobuf's JSON printer but writes 64-bit integers as
JSON numbers (protobuf writes strings); tritonclient users index into that JSON,
so the same fix-up happens here.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from .backends import BACKEND_PLATFORM, ENSEMBLE_PLATFORM, PYTHON
from .datatypes import CONFIG_TO_WIRE

ModelConfig = model_config_pb2.ModelConfig

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}

_PLATFORM_NAMES = {**BACKEND_PLATFORM, PYTHON: PYTHON}


def _walk(value: Any, desc: Descriptor, fix: Callable[[FieldDescriptor, Any], Any]) -> None:
    """Apply `fix` to every scalar (map values included, map keys excluded) of a JSON-shaped message."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        field = desc.fields_by_name.get(key) or desc.fields_by_camelcase_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(item, dict):
                continue
            value_field = field.message_type.fields_by_name["value"]
            for k, v in item.items():
                if value_field.message_type is not None:
                    _walk(v, value_field.message_type, fix)
                else:
                    item[k] = fix(value_field, v)
        elif field.message_type is not None:
            for sub in item if isinstance(item, list) else [item]:
                _walk(sub, field.message_type, fix)
        elif isinstance(item, list):
            value[key] = [fix(field, v) for v in item]
        else:
            value[key] = fix(field, item)


def _in_declaration_order(value: Any, desc: Descriptor) -> Any:
    """Rebuild a JSON-shaped message with keys in .proto order, as Triton's printer emits them."""
    if not isinstance(value, dict):
        return value
    ordered = {}
    for field in desc.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            value_type = sub.fields_by_name["value"].message_type
            if value_type is not None:
                item = {k: _in_declaration_order(v, value_type) for k, v in item.items()}
        elif sub is not None:
            if isinstance(item, list):
                item = [_in_declaration_order(v, sub) for v in item]
            else:
                item = _in_declaration_order(item, sub)
        ordered[field.name] = item
    return ordered


def _int64_as_number(field: FieldDescriptor, v: Any) -> Any:
    return int(v) if field.type in _INT64_TYPES and isinstance(v, str) else v


def _enum_upper(field: FieldDescriptor, v: Any) -> Any:
    return v.upper() if field.type == FieldDescriptor.TYPE_ENUM and isinstance(v, str) else v


def _message_to_dict(cfg: ModelConfig) -> dict:
    try:
        return json_format.MessageToDict(
            cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:
        return json_format.MessageToDict(cfg, preserving_proto_field_name=True, including_default_value_fields=True)


def config_to_json(cfg: ModelConfig) -> dict:
    """Triton's config JSON: proto field names, defaults printed, enum names, 64-bit ints as numbers.

    An empty config renders as {} (Triton answers with an empty body).
    """
    if cfg.ByteSize() == 0:
        return {}
    out = _message_to_dict(cfg)
    _walk(out, ModelConfig.DESCRIPTOR, _int64_as_number)
    return _in_declaration_order(out, ModelConfig.DESCRIPTOR)


def load_config_json(text: str) -> Any:
    """A load request's `config` text as Triton reads it: JSON, whose object keys protobuf's JSON
    parser (Triton's) also takes unquoted when they are identifiers (`{direct: {}}`). Raises
    ValueError (the strict parser's, when quoting does not help)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as strict:
        try:
            return json.loads(_quote_bare_keys(text))
        except json.JSONDecodeError:
            raise strict from None


def _quote_bare_keys(text: str) -> str:
    """Quote identifier keys outside strings: those after '{' or ',' and before ':'."""
    out: list[str] = []
    i, n = 0, len(text)
    last = ""           # the last character outside strings and whitespace
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i, last = j + 1, '"'
            continue
        if (c.isalpha() or c == "_") and last in ("{", ","):
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            k = j
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i, last = j, '"'
                continue
        out.append(c)
        if not c.isspace():
            last = c
        i += 1
    return "".join(out)


def config_from_json(d: dict) -> ModelConfig:
    """Parse config JSON (a load request's `config`): string or number ints, enum names in any case.

    Raises ValueError naming the offending field.
    """
    d = copy.deepcopy(d)
    _walk(d, ModelConfig.DESCRIPTOR, _enum_upper)
    try:
        return json_format.ParseDict(d, ModelConfig())
    except json_format.ParseError as e:
        raise ValueError(str(e)) from None


def _wire_type(data_type: int) -> str:
    return CONFIG_TO_WIRE.get(model_config_pb2.DataType.Name(data_type), "<invalid>")


def tensor_metadata(cfg: ModelConfig) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) for model metadata: name, wire datatype, shape with -1 batch dim when batching."""
    batch = [-1] if cfg.max_batch_size > 0 else []

    def describe(entries) -> list[dict]:
        return [
            {"name": io.name, "datatype": _wire_type(io.data_type), "shape": batch + list(io.dims)} for io in entries
        ]

    return describe(cfg.input), describe(cfg.output)


def platform_name(cfg: ModelConfig) -> str:
    """The platform model metadata reports (e.g. "onnxruntime_onnx", "python", "ensemble")."""
    if cfg.platform == ENSEMBLE_PLATFORM:
        return ENSEMBLE_PLATFORM
    return _PLATFORM_NAMES.get(cfg.backend) or cfg.platform or cfg.backend
