"""`tritond check DIR...`: validate repositories the way the server would load them."""
from __future__ import annotations

from tritond.repository.catalog import check_repository


def check(repositories: list[str], autocomplete: bool = True) -> int:
    """Print each model's status, errors and advice; 1 when any model is invalid."""
    specs = check_repository(repositories, autocomplete)
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
    return 1 if bad else 0
