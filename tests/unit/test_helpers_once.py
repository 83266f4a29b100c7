"""The test helpers live once, in tests/conftest.py: waiting for a condition (wait_for), checking
a client error (expect_error) and running a server that must go away cleanly (serving). This
reads every test module with `ast` (model sources kept in strings are not code here) so that
copies do not come back.

Left out: tests/conftest.py itself; tests/fixtures, model files that run inside workers, where
conftest cannot be imported; tests/conformance, the stand-alone runner of Triton's qa suites,
which starts servers the way Triton's util.sh does.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPERS = TESTS / "conftest.py"
SKIPPED = (TESTS / "fixtures", TESTS / "conformance")

# Names of the shared helpers and of the copies they replaced.
RESERVED = {"wait_for", "wait_until", "_wait", "poll", "_poll", "poll_until", "eventually", "expect_error"}


@functools.cache
def modules() -> list[tuple[Path, ast.Module]]:
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == HELPERS or any(path.is_relative_to(d) for d in SKIPPED):
            continue
        out.append((path, ast.parse(path.read_text(), str(path))))
    return out


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS.parent)}:{node.lineno}"


def helper_functions(tree: ast.Module):
    """Module-level functions and methods that are not tests (what a test nests inside itself
    is part of that test)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("test_"):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def calls(node: ast.AST, attr: str):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, (ast.Attribute, ast.Name)):
            name = sub.func.attr if isinstance(sub.func, ast.Attribute) else sub.func.id
            if name == attr:
                yield sub


def test_the_helpers_are_defined_only_in_conftest():
    found = [f"{where(path, node)} defines {node.name}" for path, tree in modules() for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in RESERVED]
    assert not found, "use conftest's helpers instead: " + "; ".join(found)


def test_no_polling_loop_outside_wait_for():
    """A `while` loop that reads time.monotonic() and sleeps is a copy of wait_for."""
    found = []
    for path, tree in modules():
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.While)):
            text = ast.unparse(loop)
            if "monotonic(" in text and any(calls(loop, "sleep")):
                found.append(where(path, loop))
    assert not found, "poll with conftest.wait_for: " + ", ".join(found)


def test_client_errors_are_checked_through_expect_error():
    """A helper that catches the clients' InferenceServerException itself is a copy of
    expect_error (a helper built on expect_error is fine)."""
    found = []
    for path, tree in modules():
        for fn in helper_functions(tree):
            for call in calls(fn, "raises"):
                if "InferenceServerException" in ast.unparse(call):
                    found.append(f"{where(path, fn)} {fn.name}")
    assert not found, "use conftest.expect_error: " + ", ".join(found)


def test_servers_are_stopped_and_checked_through_serving():
    """Stopping a server and checking it left nothing behind is `serving`'s job; a test may
    stop one early (serving's own stop is then a no-op) or check a startup that failed."""
    found = []
    for path, tree in modules():
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            stopped, checked = ({ast.unparse(c.func.value) for c in calls(fn, attr) if isinstance(c.func, ast.Attribute)}
                                for attr in ("stop", "assert_clean"))
            found += [f"{where(path, fn)} {fn.name} ({name})" for name in sorted(stopped & checked)]
    assert not found, "use conftest.serving: " + ", ".join(found)


def test_only_conftest_starts_tritond():
    found = []
    for path, tree in modules():
        for call in calls(tree, "Popen"):
            text = ast.unparse(call)
            if "command()" in text or ("tritond.cli" in text and "'start'" in text):
                found.append(where(path, call))
    assert not found, "start servers with conftest.TritondServer: " + ", ".join(found)


def test_conftest_is_imported_under_one_name():
    """`tests.conftest` would be a second copy of the module, with its own LOG_DIR."""
    found = [where(path, node) for path, tree in modules() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module == "tests.conftest"
             or isinstance(node, ast.Import) and any(a.name == "tests.conftest" for a in node.names)]
    assert not found, "import conftest as `conftest`: " + ", ".join(found)
