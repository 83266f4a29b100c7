"""The one exception a bad model configuration raises.

A config problem must be fixable from the message alone, so every error names the
model, the file it came from and the config field at fault.
"""
from __future__ import annotations


class ConfigError(Exception):
    """A model's configuration cannot be loaded or is invalid."""

    def __init__(self, model: str, file: str, field: str, message: str) -> None:
        super().__init__(message)
        self.model = model
        self.file = file
        self.field = field
        self.message = message

    def __str__(self) -> str:
        where = f"model '{self.model}', file '{self.file}'"
        if self.field:
            where += f", field '{self.field}'"
        return f"{where}: {self.message}"


class UnpolledError(ConfigError):
    """A problem Triton's repository manager finds while it polls, before a backend sees the model
    (the config names another directory): an explicit load of it answers 'failed to poll from
    model repository', the reason going to the log."""
