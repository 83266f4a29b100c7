"""Trace files appear whole: a reader listing `<file>*` never finds one half written."""
from __future__ import annotations

import json
from types import SimpleNamespace

from tritond.broker.observe import tracing


def test_a_trace_file_is_written_under_a_name_no_reader_lists(tmp_path, monkeypatch):
    tracer = tracing.Tracer(SimpleNamespace(trace={}, model_trace={}), clock=None, on_change=lambda: None)
    listed = []
    replace = tracing.os.replace

    def listing_replace(src: str, dst: str) -> None:
        listed.append(sorted(p.name for p in tmp_path.glob("trace.json*")))
        replace(src, dst)

    monkeypatch.setattr(tracing.os, "replace", listing_replace)
    tracer._write(str(tmp_path / "trace.json.0"), [{"id": 1, "model_name": "m"}])
    assert listed == [[]]         # while its bytes were written, no trace.json* existed
    assert json.loads((tmp_path / "trace.json.0").read_text()) == [{"id": 1, "model_name": "m"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0"]
