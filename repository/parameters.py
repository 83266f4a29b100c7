"""Reading a model config's `parameters { key: ... value: { string_value: ... } }` map."""
from __future__ import annotations


def config_parameter(config: dict, key: str, default: str = "") -> str:
    """The string value of `key` in a config dict (as GET /config renders it), else `default`."""
    entry = (config.get("parameters") or {}).get(key)
    if isinstance(entry, dict):
        return str(entry.get("string_value", default))
    return default
