"""The log and trace settings the logging and trace APIs read and update (Triton's keys and
checks). File locations are never settable over the network."""
from __future__ import annotations

from typing import Any

from tritond.wire.errors import Code, TritonError, invalid


class Settings:
    def __init__(self, log_verbose: int) -> None:
        self.log: dict[str, Any] = {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": log_verbose, "log_format": "default",
        }
        self.trace: dict[str, Any] = {
            "trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": "triton",
        }
        self.model_trace: dict[str, dict[str, Any]] = {}

    def update_log(self, updates: dict[str, Any]) -> dict[str, Any]:
        if updates.get("log_file") not in (None, ""):
            raise TritonError(Code.UNSUPPORTED, "log file location can not be updated through network protocol")
        for key in ("log_info", "log_warning", "log_error"):
            if key in updates:
                if not isinstance(updates[key], bool):
                    raise invalid(f"expect boolean for '{key}'")
                self.log[key] = updates[key]
        if "log_verbose_level" in updates:
            v = updates["log_verbose_level"]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise invalid("expect unsigned integer for 'log_verbose_level'")
            self.log["log_verbose_level"] = v
        if "log_format" in updates:
            fmt = updates["log_format"]
            if fmt not in ("default", "ISO8601"):
                raise TritonError(Code.UNAVAILABLE, f"invalid argument for --log_format, got: {fmt}")
            self.log["log_format"] = fmt
        return self.log

    def update_trace(self, model: str, updates: dict[str, Any]) -> dict[str, Any]:
        """Server-wide settings (model ''), or a model's overrides (None clears one)."""
        if "trace_file" in updates and updates["trace_file"] not in (None, "", []):
            raise invalid("trace file location can not be updated through network protocol")
        base = self.trace
        target = self.model_trace.setdefault(model, {}) if model else base
        for k, v in updates.items():
            if k not in base:
                raise invalid(f"unknown trace setting '{k}'")
            if v is not None:
                target[k] = v
            elif model:
                target.pop(k, None)
        return {**base, **(self.model_trace.get(model, {}) if model else {})}
