"""qa_unittest.py with boofuzz's sessions bounded: every `Session` a test makes stops after the
first QA_FUZZ_CASES test cases (its `index_end`; 0: all of them), so that a fuzz test fits the
time a run has."""
from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path

import boofuzz


def _bounded(init, cases: int):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        kwargs.setdefault("index_end", cases or None)
        init(self, *args, **kwargs)
    return wrapper


if __name__ == "__main__":
    boofuzz.Session.__init__ = _bounded(boofuzz.Session.__init__, int(os.environ.get("QA_FUZZ_CASES", "200")))
    sys.argv[0] = str(Path(__file__).with_name("qa_unittest.py"))
    runpy.run_path(sys.argv[0], run_name="__main__")
