"""Logging for every tritond process, laid out as Triton lays out its log lines.

Each process (supervisor, broker, frontends, workers) installs one handler on the root logger
with `setup`, and applies the live settings the broker broadcasts with `apply`: the levels
(`--log-info/warning/error`, `--log-verbose`), the format and the file. Formats:

  default   I0529 12:34:56.789012 1234 requests.py:88] "[request id: abc] message"
  ISO8601   2026-05-29T12:34:56Z I 1234 requests.py:88] "[request id: abc] message"
  json      {"time": "...", "level": "INFO", "pid": 1234, "role": "broker", ...} per line

As in Triton, the message of a default or ISO8601 line is a JSON string, so nothing a client
sends (an input name with a newline, a control character) can forge a line of its own;
`TRITON_SERVER_ESCAPE_LOG_MESSAGES=0` in the server's environment writes messages raw. A record
with a `table` (`table_text`) is Triton's multi-line entry: the heading, then the table's lines.

Verbose lines (Python DEBUG) print as Triton prints them, with the `I` letter, when
`--log-verbose` is at least their verbosity (1 unless a record says `verbosity`). A line
logged while a request is handled carries that request's id: frontends and workers set
`REQUEST_ID` for the request's task or batch. With a log file every process appends to it,
and `reopen` (SIGUSR1, after logrotate moved the file) opens the path again.
"""
from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time

import orjson

from tritond.wire.schema import LogConfig

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("tritond_request_id", default="")
_LETTERS = {logging.ERROR: "E", logging.WARNING: "W"}
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"


def escaping() -> bool:
    """Triton's switch, read from the environment at start-up: every value but "0" escapes."""
    return os.environ.get(ESCAPE_VARIABLE, "").strip() != "0"


class _Gate(logging.Filter):
    """Triton's switches: each level on or off, verbose lines up to a verbosity."""

    def __init__(self, cfg: LogConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def filter(self, record: logging.LogRecord) -> bool:
        cfg = self.cfg
        n = record.levelno
        if n >= logging.ERROR:
            return cfg.error
        if n >= logging.WARNING:
            return cfg.warning
        if n >= logging.INFO:
            return cfg.info
        return cfg.verbose >= getattr(record, "verbosity", 1)


def _json_string(text: str) -> str:
    """`text` as a JSON string; a lone surrogate (a file name that is not UTF-8) is written as
    its escape rather than losing the line."""
    try:
        return orjson.dumps(text).decode()
    except TypeError:
        return json.dumps(text, ensure_ascii=False).encode("utf-8", "backslashreplace").decode()


class TritonFormatter(logging.Formatter):
    def __init__(self, fmt: str, role: str) -> None:
        super().__init__()
        self.fmt = fmt
        self.role = role
        self.pid = os.getpid()
        self.escape = escaping()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        rid = getattr(record, "request_id", None) or REQUEST_ID.get()
        secs = record.created
        if self.fmt == "json":
            if getattr(record, "table", None):
                message = f"{message}\n{record.table}"
            doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int(secs % 1 * 1e6):06d}Z",
                   "level": "VERBOSE" if record.levelno < logging.INFO else record.levelname,
                   "pid": self.pid, "role": self.role, "logger": record.name,
                   "file": f"{record.filename}:{record.lineno}", "message": message}
            if rid:
                doc["request_id"] = rid
            return orjson.dumps(doc).decode()
        letter = _LETTERS.get(record.levelno, "I") if record.levelno < logging.CRITICAL else "E"
        if rid:
            message = f"[request id: {rid}] {message}"
        if self.escape and message:
            message = _json_string(message)
        table = getattr(record, "table", None)
        if table:
            message = f"{message}\n{table}"
        where = f"{self.pid} {record.filename}:{record.lineno}]"
        t = time.gmtime(secs)
        if self.fmt == "ISO8601":
            return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', t)} {letter} {where} {message}"
        return f"{letter}{time.strftime('%m%d %H:%M:%S', t)}.{int(secs % 1 * 1e6):06d} {where} {message}"


def table_text(header: list[str], rows: list[list[str]]) -> str:
    """Triton's table layout (`+---+` borders, `| cell |` rows); a cell of several lines takes
    as many table lines, so every line of the table stays a row of the same columns."""
    lines_of = [[c.splitlines() or [""] for c in row] for row in [header, *rows]]
    widths = [max(len(line) for cells in lines_of for line in cells[i]) for i in range(len(header))]
    border = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def text(cells: list[list[str]]) -> list[str]:
        height = max(len(c) for c in cells)
        return ["| " + " | ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)) + " |"
                for k in range(height)]
    body = [line for cells in lines_of[1:] for line in text(cells)]
    return "\n".join([border, *text(lines_of[0]), border, *body, border])


class _Handler(logging.StreamHandler):
    """A file opened for appending that `reopen` opens again; without one, as tritonserver
    writes its log: info and verbose lines to stdout, warnings and errors to stderr."""

    def __init__(self, path: str) -> None:
        # resolved once, when the process starts logging: a reopen finds the same file even
        # after a model's code changed the working directory
        self.path = os.path.abspath(path) if path else ""
        super().__init__(self._open() if path else sys.stderr)

    def _open(self):
        return open(self.path, "a", encoding="utf-8", buffering=1)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.path:           # called under the handler's lock
            self.stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        super().emit(record)

    def reopen(self) -> None:
        if not self.path:
            return
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            old.close()
        finally:
            self.release()

    def close(self) -> None:
        if self.path and self.stream is not None:
            self.stream.close()
        super().close()


_state: dict = {}


def _root_level(cfg: LogConfig) -> int:
    """The root logger drops what no switch lets through before a record is built."""
    if cfg.verbose > 0:
        return logging.DEBUG
    for enabled, level in ((cfg.info, logging.INFO), (cfg.warning, logging.WARNING), (cfg.error, logging.ERROR)):
        if enabled:
            return level
    return logging.CRITICAL + 1


def setup(role: str, cfg: LogConfig | None = None) -> None:
    """Install this process's handler (replacing any earlier one)."""
    cfg = cfg or LogConfig()
    root = logging.getLogger()
    old = _state.get("handler")
    if old is not None:
        root.removeHandler(old)
        old.close()
    try:
        handler = _Handler(cfg.file)
    except OSError as e:
        handler = _Handler("")
        print(f"cannot open the log file {cfg.file!r}: {e.strerror}; logging to the console", file=sys.stderr)
    gate = _Gate(cfg)
    handler.addFilter(gate)
    handler.setFormatter(TritonFormatter(cfg.format, role))
    root.addHandler(handler)
    root.setLevel(_root_level(cfg))
    _state.update(handler=handler, gate=gate, role=role, cfg=cfg)


def apply(cfg: LogConfig) -> None:
    """Live settings from the broker: switches and format now, the file reopened when the
    generation moved on (the file path itself only changes at startup)."""
    if "handler" not in _state:
        setup("tritond", cfg)
        return
    handler: _Handler = _state["handler"]
    old: LogConfig = _state["cfg"]
    _state["gate"].cfg = cfg
    if cfg.format != old.format:
        handler.setFormatter(TritonFormatter(cfg.format, _state["role"]))
    logging.getLogger().setLevel(_root_level(cfg))
    if cfg.generation != old.generation:
        handler.reopen()
    _state["cfg"] = cfg


def reopen() -> None:
    handler = _state.get("handler")
    if handler is not None:
        handler.reopen()
