"""The rate limiter through tritonclient: two models whose instances need the one unit of a
shared resource never execute at the same time (timestamps recorded by the models), while a
model without resources runs alongside them."""
from __future__ import annotations

from concurrent import futures
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from conftest import TritondServer, serving
from fault_models import add_fault_model
from lifecycle_util import infer

SHARED = 'rate_limiter { resources [ { name: "GATE" count: 1 } ] }'


def spans(markers: Path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split()[:2])) for line in (markers / "spans").read_text().splitlines()]


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("limits") / "models"
    dirs = {}
    for name, group in (("a", SHARED), ("b", SHARED), ("free", "")):
        dirs[name] = tmp_path_factory.mktemp(f"spans-{name}")
        add_fault_model(repo, name, count=2, batching=None, group=group,
                        params={"marker_dir": dirs[name], "sleep_ms": 120})
    with serving(TritondServer(repo, ["--rate-limit=execution_count"])) as s:
        yield s, dirs


def test_models_sharing_a_resource_never_execute_together(server):
    s, dirs = server

    def call(model: str) -> None:
        c = httpclient.InferenceServerClient(s.http_url, network_timeout=60)
        infer(c, model)
        c.close()

    with futures.ThreadPoolExecutor(12) as pool:
        list(pool.map(call, ["a", "b", "free"] * 4))
    a, b, free = spans(dirs["a"]), spans(dirs["b"]), spans(dirs["free"])
    assert len(a) == len(b) == len(free) == 4
    assert overlaps(a, a) == len(a) and overlaps(b, b) == len(b)     # each only with itself: one at a time
    assert overlaps(a, b) == 0
    assert overlaps(a + b, free) > 0 and overlaps(free, free) > len(free)
