"""The model-config and logging part of tritond's `triton_python_backend_utils` (re-exported
by workers/pb_utils.py, which model.py files import as pb_utils): config lookups,
`ModelConfig` for `auto_complete_config`, and `Logger`. Names, texts and values follow
Triton's python_backend, because model code compares and prints them.
"""
from __future__ import annotations

import copy
import enum
import json
import logging


# ---------------------------------------------------------------- model config

def _config_dict(model_config: dict | ModelConfig) -> dict:
    return model_config.as_dict() if isinstance(model_config, ModelConfig) else model_config


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in _config_dict(model_config).get("input") or []:
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in _config_dict(model_config).get("output") or []:
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """The config auto_complete_config may extend: batching, inputs, outputs, decoupling.

    Changes that contradict what config.pbtxt already says raise ValueError, which fails
    the load with that message, as in Triton.
    """

    def __init__(self, model_config: str | dict) -> None:
        if isinstance(model_config, str):
            self._model_config = json.loads(model_config)
        else:
            self._model_config = copy.deepcopy(model_config)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return self._model_config.get("name", "")

    def as_dict(self) -> dict:
        return self._model_config

    def max_batch_size(self) -> int:
        return self._model_config["max_batch_size"]

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict) -> None:
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict, allowed: tuple[str, ...]) -> None:
        model = self._name
        label = f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{model}'"
        if any(key not in allowed for key in tensor):
            quoted = [f"'{key}'" for key in allowed]
            raise ValueError(
                f"{label} contains property other than {', '.join(quoted[:-1])} and {quoted[-1]}.")
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{label} is missing '{key}' property.")

        name = tensor["name"]
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {current_type} "
                    f"for {kind} '{name}', model provides {tensor['data_type']}")
            current_dims = list(current.get("dims") or [])
            if current_dims and current_dims != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims {list(tensor['dims'])} "
                    f"but the model configuration specifies dims {current_dims}")
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} "
                    f"but the model configuration specifies optional {current['optional']}")
            current.update(tensor)
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                f"model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted


# ---------------------------------------------------------------- logging

class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_PY_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
              LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}
_logger = logging.getLogger("tritond.model")


class Logger:
    """Model logging, routed to the Python logger 'tritond.model' (VERBOSE is DEBUG)."""
    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):     # Triton's binding takes its enum, not a number
            raise TypeError(f"log(): the level must be a pb_utils.Logger level, not {type(level).__name__}")
        _logger.log(_PY_LEVELS[level], "%s", _text(message))

    @staticmethod
    def log_info(message: str) -> None:
        _logger.info("%s", _text(message))

    @staticmethod
    def log_warn(message: str) -> None:
        _logger.warning("%s", _text(message))

    @staticmethod
    def log_error(message: str) -> None:
        _logger.error("%s", _text(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _logger.debug("%s", _text(message))


def _text(message: str) -> str:
    if not isinstance(message, str):
        raise TypeError(f"a log message must be a str, not {type(message).__name__}")
    return message
