"""Config fields and parameters that change what a model does and that tritond does not
implement yet.

Rule: a model that asks for one of these fails to load with the reason; it never loads READY
and then behaves differently from Triton (a sequence model run without its control inputs, a
cache that caches nothing). The tables are data: when a feature lands, its entry leaves.

A field is named by its path in `inference.ModelConfig`; a path through a repeated field
(`instance_group.rate_limiter`) matches when any element sets it. A message field is set when
present, a scalar when not its default, a repeated field when not empty.
"""
from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from .errors import ConfigError

FIELDS: dict[str, str] = {
    "instance_group.host_policy": "host policies",
    "instance_group.passive": "passive instances",
    "model_repository_agents": "repository agents",
    "model_operations": "custom operation libraries",
    "ensemble_scheduling.step.model_namespace": "model namespacing",
}

PARAMETERS: dict[str, str] = {
    "EXECUTION_ENV_PATH": "custom Python execution environments (conda-pack archives)",
}

# Parameters that mean something to one backend only (others ignore them, as Triton's do).
BACKEND_PARAMETERS: dict[str, dict[str, str]] = {
    "pytorch": {"ENABLE_WEIGHT_SHARING": "weights shared between the instances of a model (each tritond instance "
                                         "is its own process)"},
}


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)      # protobuf >= 6; `label` is deprecated there
    return flag if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _is_set(msg: Message, path: list[str]) -> bool:
    name, rest = path[0], path[1:]
    field = msg.DESCRIPTOR.fields_by_name[name]
    value = getattr(msg, name)
    if _repeated(field):
        return any(_is_set(v, rest) for v in value) if rest else len(value) > 0
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return msg.HasField(name) and (not rest or _is_set(value, rest))
    return bool(value)


def unsupported(cfg: Message) -> tuple[str, str] | None:
    """(field, reason) for the first unsupported field or parameter `cfg` uses, else None."""
    for path, what in FIELDS.items():
        if _is_set(cfg, path.split(".")):
            return path, f"'{path}' ({what}) is not supported by tritond yet"
    for key, what in (PARAMETERS | BACKEND_PARAMETERS.get(getattr(cfg, "backend", ""), {})).items():
        if key in cfg.parameters:
            return f"parameters.{key}", f"parameter '{key}' ({what}) is not supported by tritond yet"
    return None


def check_supported(cfg: Message, config_file: str) -> None:
    """Raise ConfigError naming the field when `cfg` needs something tritond does not do."""
    found = unsupported(cfg)
    if found is not None:
        field, reason = found
        raise ConfigError(cfg.name, config_file, field, reason)
