"""Reading a model config's `parameters { key: ... value: { string_value: ... } }` map."""
from __future__ import annotations


def config_parameter(config: dict, key: str, default: str = "") -> str:
    """The string value of `key` in a config dict (as GET /config renders it), else `default`."""
    entry = (config.get("parameters") or {}).get(key)
    if isinstance(entry, dict):
        return str(entry.get("string_value", default))
    return default


def parameter_text(cfg, key: str) -> str:
    """The string value of `key` in a ModelConfig message's parameters, else ''."""
    entry = cfg.parameters.get(key)
    return entry.string_value if entry is not None else ""


def int_parameter(cfg, key: str, fail) -> int | None:
    """An integer parameter of a ModelConfig message, None when absent; `fail(field, message)`
    builds the error for a value that is not an integer."""
    text = parameter_text(cfg, key).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise fail(f"parameters.{key}", f"parameter '{key}' must be an integer, got '{text}'") from None
