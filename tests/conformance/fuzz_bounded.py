"""qa_unittest.py with boofuzz's sessions bounded as test.sh's boofuzz 0.3.0 ran them, and in
length. test.sh pins boofuzz 0.3.0, which mutates one element of a request at a time; 0.4's
`Session.fuzz()` goes on to combine mutations without a depth limit, which never ends in
practice, so every fuzz here has `max_depth=1`. Every `Session` stops after the first
QA_FUZZ_CASES test cases (its `index_end`; 0: all of them), so that the test fits a run's time."""
from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path

import boofuzz


def _with_default(fn, name: str, value):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        kwargs.setdefault(name, value)
        return fn(*args, **kwargs)
    return wrapper


if __name__ == "__main__":
    cases = int(os.environ.get("QA_FUZZ_CASES", "0"))
    boofuzz.Session.__init__ = _with_default(boofuzz.Session.__init__, "index_end", cases or None)
    boofuzz.Session.fuzz = _with_default(boofuzz.Session.fuzz, "max_depth", 1)
    sys.argv[0] = str(Path(__file__).with_name("qa_unittest.py"))
    runpy.run_path(sys.argv[0], run_name="__main__")
