"""The log and trace settings the logging and trace APIs read and update (Triton's keys and
checks), starting from the command line's. Every change is applied live: `on_change` makes the
broker broadcast the log settings and the tracing gates to every process. File locations are
never settable over the network."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import msgspec

from tritond.wire.errors import Code, TritonError, invalid
from tritond.wire.options import OtelConfig, TraceConfig
from tritond.wire.replies import LogSettingValues
from tritond.wire.schema import LOG_FORMATS, LogConfig

TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


def trace_values(cfg: TraceConfig) -> dict[str, Any]:
    """The API's view (strings, as Triton answers) of the `--trace-config` options."""
    return {
        "trace_file": cfg.file,
        "trace_level": ([cfg.level] if cfg.level != "OFF" or not cfg.tensors else []) + (["TENSORS"] if cfg.tensors else []),
        "trace_rate": str(cfg.rate),
        "trace_count": str(cfg.count), "log_frequency": str(cfg.log_frequency), "trace_mode": cfg.mode,
    }


def otel_values(cfg: OtelConfig) -> dict[str, str]:
    """What the API shows in opentelemetry mode, as tritonserver lists its `opentelemetry,...`
    settings: the url and resource given, then the batch span processor's."""
    shown = {} if cfg.url == OtelConfig().url else {"url": cfg.url}
    if cfg.resource:
        key, value = list(cfg.resource.items())[-1]      # one key in a JSON object: the last given
        shown["resource"] = f"{key}={value}"
    return {**shown, "bsp_max_queue_size": str(cfg.bsp_max_queue_size),
            "bsp_schedule_delay": str(cfg.bsp_schedule_delay),
            "bsp_max_export_batch_size": str(cfg.bsp_max_export_batch_size)}


def settings_view(values: dict[str, Any], otel: dict[str, str]) -> dict[str, str | list[str]]:
    """One scope's settings as tritonserver answers them: the file and log frequency in mode
    triton, the opentelemetry settings in mode opentelemetry."""
    view = {k: values[k] for k in ("trace_level", "trace_rate", "trace_count")}
    if values["trace_mode"] == "triton":
        view.update(log_frequency=values["log_frequency"], trace_file=values["trace_file"])
    view["trace_mode"] = values["trace_mode"]
    return {**view, **otel} if values["trace_mode"] == "opentelemetry" else view


INT32_MAX = 2 ** 31 - 1


def _uint_setting(key: str, value: Any, minimum: int = 0) -> str:
    """An integer setting as tritonserver reads it (std::stoi: an int32), refused in its words."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise invalid(f"Unable to parse '{key}', expecting an integer string, got: {value}") from None
    if not -INT32_MAX - 1 <= n <= INT32_MAX:
        shown = f"{minimum}, {INT32_MAX}" if minimum < 0 else f"0, {2 ** 32 - 1}"      # its message's bounds
        raise invalid(f"Unable to parse '{key}', value is out of range [ {shown} ], got: {value}")
    if n < minimum:
        raise invalid(f"'{key}' must be at least {minimum}, got: {value}")
    return str(n)


class Settings:
    def __init__(self, log: LogConfig, trace: TraceConfig, on_change: Callable[[], None] = lambda: None) -> None:
        self.log_config = log
        self.trace: dict[str, Any] = trace_values(trace)
        self.startup_trace = dict(self.trace)    # what clearing a server-wide setting restores
        self.otel_view = otel_values(trace.otel)
        self.model_trace: dict[str, dict[str, Any]] = {}
        self.on_change = on_change

    @property
    def log(self) -> LogSettingValues:
        c = self.log_config
        return LogSettingValues(c.file, c.info, c.warning, c.error, c.verbose, c.format)

    def update_log(self, updates: dict[str, Any]) -> LogSettingValues:
        if updates.get("log_file") not in (None, ""):
            raise TritonError(Code.UNSUPPORTED, "log file location can not be updated through network protocol")
        c = self.log_config
        changes: dict[str, Any] = {}
        for key, field in (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error")):
            if key in updates:
                if not isinstance(updates[key], bool):
                    raise invalid(f"expect boolean for '{key}'")
                changes[field] = updates[key]
        if "log_verbose_level" in updates:
            v = updates["log_verbose_level"]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise invalid("expect unsigned integer for 'log_verbose_level'")
            changes["verbose"] = v
        if "log_format" in updates:
            fmt = updates["log_format"]
            if fmt not in LOG_FORMATS:
                raise TritonError(Code.UNAVAILABLE, f"invalid argument for --log_format, got: {fmt}")
            changes["format"] = fmt
        if changes:
            self.log_config = msgspec.structs.replace(c, **changes)
            self.on_change()
        return self.log

    def reopen_log(self) -> None:
        """Every process opens its log file again (after logrotate moved it)."""
        self.log_config = msgspec.structs.replace(self.log_config, generation=self.log_config.generation + 1)
        self.on_change()

    def update_trace(self, model: str, updates: dict[str, Any]) -> dict[str, str | list[str]]:
        """Server-wide settings (model ''), or a model's overrides (None clears one)."""
        if "trace_file" in updates and updates["trace_file"] not in (None, "", []):
            raise invalid("trace file location can not be updated through network protocol")
        base = self.trace
        checked: dict[str, Any] = {}
        for k, v in updates.items():
            if k not in base:
                raise invalid(f"unknown trace setting '{k}'")
            checked[k] = None if v is None else self._check(k, v)
        if "TENSORS" in (checked.get("trace_level") or ()) and base["trace_mode"] == "opentelemetry":
            raise TritonError(Code.UNSUPPORTED, "trace level 'TENSORS' is not supported in opentelemetry mode")
        target = self.model_trace.setdefault(model, {}) if model else base
        for k, v in checked.items():
            if k == "trace_file":
                continue
            if v is not None:
                target[k] = v
            elif model:
                target.pop(k, None)
            else:                       # as Triton: back to the value the server started with
                target[k] = self.startup_trace[k]
        if checked:
            self.on_change()
        return settings_view({**base, **(self.model_trace.get(model, {}) if model else {})}, self.otel_view)

    @staticmethod
    def _check(key: str, value: Any) -> Any:
        if key == "trace_level":
            levels = value if isinstance(value, list) else [value]
            for level in levels:
                if level not in TRACE_LEVELS:
                    raise invalid(f"invalid value for 'trace_level': '{level}' (OFF, TIMESTAMPS or TENSORS)")
            return list(levels)
        if key in ("trace_rate", "log_frequency"):
            return _uint_setting(key, value)
        if key == "trace_count":
            return _uint_setting(key, value, -1)
        if key == "trace_mode":
            if value not in ("triton", "opentelemetry"):
                raise invalid(f"invalid value for 'trace_mode': '{value}' (triton or opentelemetry)")
            if value == "opentelemetry" and importlib.util.find_spec("opentelemetry.sdk") is None:
                raise TritonError(Code.UNSUPPORTED, "trace mode 'opentelemetry' needs the OpenTelemetry SDK: "
                                                    "pip install 'tritond[otel]'")
            return value
        return value
