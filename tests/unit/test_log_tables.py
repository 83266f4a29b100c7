"""Triton's multi-line log entries: a heading, then a table whose every line is a row of the same
columns (L0_logging's validator reads them so), and escaped one-line messages beside them."""
from __future__ import annotations

import json
import logging
import re

from tritond import logs

ROW = re.compile(r"^\| (?P<row>.*?) \|$")
BORDER = re.compile(r"^\+[-+]+\+$")


def record(message: str, **extra) -> logging.LogRecord:
    r = logging.LogRecord("tritond", logging.INFO, "startup.py", 7, message, (), None)
    r.__dict__.update(extra)
    return r


def test_a_table_keeps_its_columns_when_a_cell_has_several_lines():
    text = logs.table_text(["Model", "Version", "Status"],
                           [["simple", "1", "READY"], ["broken", "", "UNAVAILABLE: KeyError\n\nAt:\n  model.py(4)"]])
    lines = text.splitlines()
    assert BORDER.match(lines[0]) and BORDER.match(lines[2]) and BORDER.match(lines[-1])
    rows = [[c.strip() for c in ROW.match(line)["row"].split("|")] for line in lines if not BORDER.match(line)]
    assert rows[0] == ["Model", "Version", "Status"]
    assert rows[1] == ["simple", "1", "READY"]
    assert rows[2] == ["broken", "", "UNAVAILABLE: KeyError"]
    assert [r[2] for r in rows[3:]] == ["", "At:", "model.py(4)"] and all(r[:2] == ["", ""] for r in rows[3:])
    assert len({len(line) for line in lines}) == 1


def test_an_escaped_heading_then_the_raw_table(monkeypatch):
    monkeypatch.delenv(logs.ESCAPE_VARIABLE, raising=False)
    table = logs.table_text(["Model"], [["simple"]])
    out = logs.TritonFormatter("default", "supervisor").format(record("", table=table)).split("\n")
    assert out[0].endswith("startup.py:7] ") and out[1:] == table.splitlines()
    line = logs.TritonFormatter("ISO8601", "supervisor").format(record('a "quoted"\nword'))
    assert json.loads(line.split("] ", 1)[1]) == 'a "quoted"\nword' and "\n" not in line


def test_messages_raw_when_escaping_is_off(monkeypatch):
    monkeypatch.setenv(logs.ESCAPE_VARIABLE, "0")
    line = logs.TritonFormatter("default", "supervisor").format(record("two\nlines"))
    assert line.split("] ", 1)[1] == "two\nlines"


def test_a_tab_is_escaped_once_and_a_lone_surrogate_keeps_its_line(monkeypatch):
    monkeypatch.delenv(logs.ESCAPE_VARIABLE, raising=False)
    fmt = logs.TritonFormatter("default", "broker")
    assert fmt.format(record("Resource: R1\t Count: 3")).endswith('] "Resource: R1\\t Count: 3"')
    line = fmt.format(record("no such file '/models/\udcff'"))
    assert line.endswith('] "no such file \'/models/\\udcff\'"')
