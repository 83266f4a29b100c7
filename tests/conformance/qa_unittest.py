"""Run unittest cases of one qa test module the way its test.sh does (`python3 <module>.py
Class.test ...`, from the module's directory) and append one JSON line per case to a results
file: {"case", "status" (pass | fail | error | skip), "detail"}.

Usage: python qa_unittest.py <results.jsonl> <label> <module.py> [Class.test ...]
(no names: every test of the module, like `unittest.main()`). The environment variable
QA_SKIP (a JSON object {"Class.test": reason}) names cases not to run; each is recorded as skip.
QA_PATCH (a JSON object {"name": value}, a name possibly dotted: "Class.attribute") sets module
globals once the module is loaded: what the module's `__main__` block would have set from the
environment, or a runner deviation the suite prints (a trial list that names a TensorRT model first).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import unittest


class _Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: list[tuple[str, str, str]] = []

    def _name(self, test: unittest.TestCase) -> str:
        return test.id().split(".", 1)[-1]

    def addSuccess(self, test):
        super().addSuccess(test)
        self.records.append((self._name(test), "pass", ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.records.append((self._name(test), "fail", self._exc_info_to_string(err, test)))

    def addError(self, test, err):
        super().addError(test, err)
        name = self._name(test) if isinstance(test, unittest.TestCase) else str(test)
        self.records.append((name, "error", self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.records.append((self._name(test), "skip", reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.records.append((self._name(test), "pass", "expected failure"))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.records.append((self._name(test), "fail", "unexpected success"))


def _without(suite: unittest.TestSuite, skip: dict[str, str], records: list) -> unittest.TestSuite:
    """The suite less the cases `skip` names (recorded as skipped with their reason)."""
    kept = unittest.TestSuite()
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            kept.addTest(_without(test, skip, records))
            continue
        name = test.id().split(".", 1)[-1]
        if name in skip:
            records.append((name, "skip", skip[name]))
        else:
            kept.addTest(test)
    return kept


def main(results: str, label: str, module_path: str, names: list[str]) -> int:
    module_path = os.path.abspath(module_path)
    sys.path.insert(0, os.path.dirname(module_path))
    stem = os.path.splitext(os.path.basename(module_path))[0]
    spec = importlib.util.spec_from_file_location(stem, module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    loader = unittest.TestLoader()
    records: list[tuple[str, str, str]] = []
    try:
        spec.loader.exec_module(module)
        for name, value in json.loads(os.environ.get("QA_PATCH", "{}")).items():
            *owners, attr = name.split(".")
            target = module
            for owner in owners:
                target = getattr(target, owner)
            setattr(target, attr, tuple(value) if isinstance(value, list) else value)
        suite = loader.loadTestsFromNames(names, module) if names else loader.loadTestsFromModule(module)
        suite = _without(suite, json.loads(os.environ.get("QA_SKIP", "{}")), records)
        runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=2)
        records += runner.run(suite).records
    except Exception as e:                      # import or name errors: every named case errors
        records = [(n, "error", f"{type(e).__name__}: {e}") for n in (names or [stem])]
    with open(results, "a", encoding="utf-8") as f:
        for case, status, detail in records:
            f.write(json.dumps({"label": label, "case": case, "status": status,
                                "detail": detail[-2000:]}) + "\n")
    return 0 if all(s in ("pass", "skip") for _, s, _ in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
