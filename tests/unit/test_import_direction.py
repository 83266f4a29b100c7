"""The import direction of DESIGN.md §5, checked on the source with `ast`.

The folders install under `tritond.*` through package_dir, which import-linter's static
graph cannot follow in an editable install, so the rules are checked here directly.
"""
from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"tritond": "tritond", "broker": "tritond.broker", "workers": "tritond.workers",
           "frontend": "tritond.frontend", "shm": "tritond.shm", "repository": "tritond.repository",
           "wire": "tritond.wire"}
TOP = ("tritond.cli", "tritond.supervisor", "tritond.options", "tritond.check", "tritond.mps")
PROCESSES = ("tritond.broker", "tritond.workers", "tritond.frontend")

# (source package, forbidden import prefixes)
RULES = [
    ("tritond.wire", ("tritond.shm", "tritond.repository", "tritond.process") + PROCESSES + TOP),
    ("tritond.process", ("tritond.shm", "tritond.repository") + PROCESSES + TOP),
    ("tritond.shm", PROCESSES + TOP),
    ("tritond.repository", PROCESSES + TOP),
    ("tritond.broker", ("tritond.workers", "tritond.frontend") + TOP),
    ("tritond.workers", ("tritond.broker", "tritond.frontend") + TOP),
    ("tritond.frontend", ("tritond.broker", "tritond.workers") + TOP),
    ("tritond.shm", ("starlette", "uvicorn", "hypercorn", "grpc")),
    ("tritond.repository", ("starlette", "uvicorn", "hypercorn", "grpc")),
    ("tritond.broker", ("starlette", "uvicorn", "hypercorn", "grpc")),
    ("tritond.workers", ("starlette", "uvicorn", "hypercorn", "grpc")),
    ("tritond.wire", ("zmq", "numpy", "starlette", "grpc")),
    ("tritond.frontend", ("onnxruntime", "torch", "tensorrt", "openvino", "tensorflow")),
    # Frameworks load only in their workers (the repository reads their model files without them).
    ("tritond.broker", ("openvino", "tensorflow")),
    ("tritond.repository", ("openvino", "tensorflow")),
    # perf and analyze are clients: they reach the server through its HTTP/gRPC API only
    ("tritond.perf", ("tritond.broker", "tritond.workers", "tritond.frontend", "tritond.shm", "tritond.analyze") + TOP),
    ("tritond.analyze", ("tritond.broker", "tritond.workers", "tritond.frontend", "tritond.shm") + TOP),
]


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def matches(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def violations() -> list[str]:
    out = []
    for name, path in modules().items():
        imported = imports_of(name, path)
        for source, forbidden in RULES:
            if not matches(name, source):
                continue
            for mod in imported:
                for bad in forbidden:
                    if matches(mod, bad):
                        out.append(f"{name} imports {mod}")
    return sorted(set(out))


def test_import_direction_holds():
    assert violations() == []


def test_checker_catches_a_violation(tmp_path, monkeypatch):
    leaf = tmp_path / "shm"
    leaf.mkdir()
    (leaf / "bad.py").write_text("from tritond.broker import server\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "FOLDERS", {"shm": "tritond.shm"})
    assert violations() == ["tritond.shm.bad imports tritond.broker", "tritond.shm.bad imports tritond.broker.server"]


def cycles_in(package: str) -> list[list[str]]:
    """Import cycles among the modules of one package, TYPE_CHECKING imports included."""
    mods = {n: p for n, p in modules().items() if n.startswith(package + ".")}
    graph = {n: sorted(m for m in imports_of(n, p) if m in mods and m != n) for n, p in mods.items()}
    found, state = [], {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in graph[n]:
            if state.get(m) == 1:
                found.append(path[path.index(m):] + [m])
            elif m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return found


def test_no_import_cycle_inside_a_package():
    for package in ("tritond.broker", "tritond.frontend", "tritond.workers", "tritond.repository",
                    "tritond.shm", "tritond.wire"):
        assert cycles_in(package) == [], package
