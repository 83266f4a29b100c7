"""`tritond check DIR...`: validate repositories the way the server would load them."""
from __future__ import annotations

import sys

from tritond.repository.catalog import check_repository
from tritond.repository.layout import repository_problem
from tritond.repository.python_based import DEFAULT_BACKEND_DIRECTORY


def check(repositories: list[str], autocomplete: bool = True, memory: bool = False,
          backend_directory: str = DEFAULT_BACKEND_DIRECTORY) -> int:
    """Print each model's status, errors and advice (and with `memory`, what serving the
    repository will cost); 1 when any model is invalid."""
    for repo in repositories:
        problem = repository_problem(repo)
        if problem:
            print(f"tritond check: {problem}", file=sys.stderr)
            return 1
    specs = check_repository(repositories, autocomplete, backend_directory=backend_directory)
    bad = 0
    for spec in specs:
        if spec.error:
            bad += 1
            print(f"{spec.name}: UNAVAILABLE: {spec.error}")
        else:
            versions = ",".join(str(v) for v in spec.versions)
            print(f"{spec.name}: OK (versions {versions})")
        for line in spec.advice:
            print(f"  advice: {line}")
    print(f"{len(specs) - bad} of {len(specs)} models valid")
    if memory:
        from .memory import report
        print(report(specs))
    return 1 if bad else 0
