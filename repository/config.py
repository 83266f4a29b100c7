"""Loading a model's config.pbtxt into Triton's own ModelConfig message, completed and normalized.

The file is parsed with protobuf's text format against the schema that ships in
tritonclient, so exactly what Triton accepts is accepted. Then, in Triton's
order: core autofill (name, backend, platform), backend auto-complete (ONNX
graphs), normalization. Validation is `validate_config`.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from .autofill import autofill_backend
from .backends import DEFAULT_MODEL_FILENAME, ONNXRUNTIME, OPENVINO, SAVEDMODEL_PLATFORM, TENSORFLOW
from .devices import gpu_count
from .errors import ConfigError
from .layout import ModelSource, version_dirs
from .normalize import normalize_config
from .onnx_autocomplete import autocomplete_onnx
from .python_based import DEFAULT_BACKEND_DIRECTORY, resolve_runtime
from .openvino_autocomplete import autocomplete_openvino
from .tensorflow_autocomplete import autocomplete_savedmodel
from .validation import check_model_filenames, validate_config

__all__ = [
    "CONFIG_FILE",
    "OVERRIDE_FILE",
    "config_path",
    "gpu_count",
    "load_model_config",
    "normalize_config",
    "parse_config_text",
    "validate_config",
]

ModelConfig = model_config_pb2.ModelConfig

CONFIG_FILE = "config.pbtxt"
OVERRIDE_FILE = "<config given with the load request>"

_PARSE_LOCATION = re.compile(r"^\d+:\d+ : ")
_PARSE_FIELD = re.compile(r'(?:field named|Field) "(\w+)"')
_FIELD_BEFORE_VALUE = re.compile(r"([A-Za-z_]\w*)\s*[:{\[]")
_NOT_INTEGER = re.compile(r"Couldn't parse integer: (.*)$")
_OUT_OF_RANGE = re.compile(r"Value out of range: (-?)(\d+)$")


def config_path(model_path: str, config_name: str = "") -> str:
    """`configs/<config_name>.pbtxt` when named and present (as --model-config-name), else config.pbtxt."""
    if config_name:
        custom = os.path.join(model_path, "configs", config_name + ".pbtxt")
        if os.path.isfile(custom):
            return custom
    return os.path.join(model_path, CONFIG_FILE)


def parse_config_text(text: str, model: str, file: str) -> ModelConfig:
    """Parse text-format ModelConfig; a syntax or schema error becomes a ConfigError with its line."""
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        detail = _triton_wording(_PARSE_LOCATION.sub("", str(e)))
        where = f"line {e.GetLine()}, column {e.GetColumn()}: " if e.GetLine() else ""
        raise ConfigError(model, file, _parse_error_field(text, e, detail), where + detail) from None
    return cfg


def _triton_wording(detail: str) -> str:
    """An integer value's parse error in the words of the C++ text-format parser Triton uses;
    a negative value out of range is one given to an unsigned field, whose parser stops at '-'."""
    m = _NOT_INTEGER.search(detail)
    if m:
        return detail[:m.start()] + f"Expected integer, got: {m.group(1)}"
    m = _OUT_OF_RANGE.search(detail)
    if m:
        words = "Expected integer, got: -" if m.group(1) else f"Integer out of range ({m.group(2)})"
        return detail[:m.start()] + words
    return detail


def _parse_error_field(text: str, e: text_format.ParseError, detail: str) -> str:
    """The field a parse error is about: named in the message, else the last `name:` before the error."""
    named = _PARSE_FIELD.search(detail)
    if named:
        return named.group(1)
    lines = text.splitlines()
    if not 0 < e.GetLine() <= len(lines):
        return ""
    before = lines[e.GetLine() - 1][: e.GetColumn()]
    keys = _FIELD_BEFORE_VALUE.findall(before)
    return keys[-1] if keys else ""


def _read_config(path: str, model: str) -> ModelConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(model, path, "", f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    except OSError as e:
        raise ConfigError(model, path, "", f"cannot read: {e.strerror}") from None
    return parse_config_text(text, model, path)


def load_model_config(
    source: ModelSource,
    *,
    autocomplete: bool = True,
    default_max_batch_size: int | Mapping[str, int] = 4,
    config_name: str = "",
    override: ModelConfig | None = None,
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY,
) -> ModelConfig:
    """The completed, normalized (not yet validated) config of a model directory.

    `override` replaces the file, as a load request's `config` parameter does.
    Without a config file the model loads only if auto-complete is on and the
    backend can be told from the files. A missing model file is left for
    `validate_config` to report. Python models keep empty inputs and
    outputs here; their worker runs `auto_complete_config`. OpenVINO and
    SavedModel configs are checked against the model file even without
    auto-complete, as their Triton backends do at load. `default_max_batch_size`
    may map backend names ('' for the rest) to Triton's `default-max-batch-size`. A backend
    `backend_directory` holds as a Python-based one gets runtime model.py. Raises ConfigError.
    """
    file = config_path(source.path, config_name)
    if override is not None:
        file = OVERRIDE_FILE
        cfg = ModelConfig()
        cfg.CopyFrom(override)
    elif os.path.isfile(file):
        cfg = _read_config(file, source.name)
    elif autocomplete:
        cfg = ModelConfig()
    else:
        raise ConfigError(source.name, file, "", "the model has no configuration file and auto-complete is disabled")

    if not cfg.name:
        cfg.name = source.name

    versions = version_dirs(source.path)
    first_version = os.path.join(source.path, str(versions[0])) if versions else None
    autofill_backend(cfg, source.name, first_version, file)
    resolve_runtime(cfg, backend_directory)
    check_model_filenames(cfg, file)
    filename = cfg.default_model_filename or DEFAULT_MODEL_FILENAME.get(cfg.backend, "")
    model_file = os.path.join(first_version, filename) if first_version is not None else ""
    if model_file and os.path.exists(model_file):
        max_batch = backend_default(default_max_batch_size, cfg.backend)
        if autocomplete and cfg.backend == ONNXRUNTIME:
            autocomplete_onnx(cfg, model_file, file, max_batch)
        elif cfg.backend == OPENVINO:
            autocomplete_openvino(cfg, model_file, file, max_batch, fill=autocomplete)
        elif cfg.backend == TENSORFLOW and cfg.platform == SAVEDMODEL_PLATFORM:
            autocomplete_savedmodel(cfg, model_file, file, max_batch, fill=autocomplete)
    normalize_config(cfg)
    return cfg


def backend_default(value: int | Mapping[str, int], backend: str) -> int:
    """`default-max-batch-size` for a backend: its own entry, else the entry for all ('')."""
    if isinstance(value, Mapping):
        return int(value.get(backend, value.get("", 4)))
    return int(value)
