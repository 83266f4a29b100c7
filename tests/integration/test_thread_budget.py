"""The host's thread budget through real processes: each worker's BLAS and OpenMP pools get
its share of the usable cores among the server's CPU instances (workers forked from a
template that imported numpy long before included), a model's thread parameter overrides it,
one log line per instance says what it got and why, and an invalid count fails the load."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TritondServer, expect_error, serving

from tritond.repository.threads import usable_cores

RESERVED = 3        # the broker, one HTTP and one gRPC frontend process keep a core each
MODEL_SOURCE = Path(__file__).resolve().parent.parent / "fixtures" / "thread_model.py"


def add_thread_model(repo: Path, name: str, count: int = 1, params: dict[str, str] | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(MODEL_SOURCE, repo / name / "1" / "model.py")
    lines = [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0",
             'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
             'output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 1, 4 ] } ]',
             f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in (params or {}).items()]
    (repo / name / "config.pbtxt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def tserver(tmp_path_factory):
    repo = tmp_path_factory.mktemp("threads") / "models"
    add_thread_model(repo, "pair", count=2)
    add_thread_model(repo, "tuned", params={"INTRA_OP_THREAD_COUNT": "3", "IMPORT_TORCH": "yes"})
    add_thread_model(repo, "negative", params={"INTRA_OP_THREAD_COUNT": "-2"})
    add_thread_model(repo, "words", params={"INTER_OP_THREAD_COUNT": "four"})
    args = ["--model-control-mode=explicit", "--load-model=pair", "--load-model=tuned"]
    with serving(TritondServer(repo, args)) as s:
        yield s


def report(server: TritondServer, model: str) -> dict[str, int]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    try:
        blas, omp, torch, pid = client.infer(model, [x]).as_numpy("OUTPUT0").reshape(-1).tolist()
    finally:
        client.close()
    return {"blas": blas, "omp": omp, "torch": torch, "pid": pid}


def both_instances(server: TritondServer, model: str) -> dict[int, dict[str, int]]:
    """The reports of a 2-instance model's workers, by pid (asked until both answered, 60 at most)."""
    seen: dict[int, dict[str, int]] = {}
    for _ in range(60):
        r = report(server, model)
        seen[r["pid"]] = r
        if len(seen) == 2:
            break
    return seen


def test_each_instance_gets_its_share_of_the_cores_by_default(tserver):
    # 'pair' (2 instances) and 'tuned' (1) are the server's three CPU instances.
    share = max(1, (usable_cores() - RESERVED) // 3)
    seen = both_instances(tserver, "pair")
    assert len(seen) == 2, "both instances of 'pair' answer"
    for r in seen.values():
        assert (r["blas"], r["omp"]) == (share, share), r
    for i in range(2):
        assert (f"model 'pair' version 1 instance 'pair_0_{i}': {share} thread(s) "
                f"({usable_cores()} usable core(s), less {RESERVED} for the broker and the frontends, shared by "
                f"3 CPU instance(s) of the loaded models") in tserver.log


def test_the_thread_parameter_overrides_the_share_for_late_imports_too(tserver):
    r = report(tserver, "tuned")
    assert (r["blas"], r["omp"], r["torch"]) == (3, 3, 3), r
    assert "model 'tuned' version 1 instance 'tuned_0_0': 3 thread(s) (parameter INTRA_OP_THREAD_COUNT=3)" \
        in tserver.log


@pytest.mark.parametrize("model, key, value", [("negative", "INTRA_OP_THREAD_COUNT", "-2"),
                                               ("words", "INTER_OP_THREAD_COUNT", "four")])
def test_an_invalid_thread_count_fails_the_load_with_the_reason(tserver, model, key, value):
    client = httpclient.InferenceServerClient(tserver.http_url, network_timeout=60)
    try:
        expect_error(lambda: client.load_model(model),
                     text=f"parameter '{key}' must be a non-negative integer")
        assert not client.is_model_ready(model)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert f"got '{value}'" in index[model].get("reason", "")
    finally:
        client.close()


def test_spawned_workers_get_the_budget_too(tmp_path):
    repo = tmp_path / "models"
    add_thread_model(repo, "pair", count=2)
    share = max(1, (usable_cores() - RESERVED) // 2)
    with serving(TritondServer(repo, ["--worker-templates=false"])) as s:
        seen = both_instances(s, "pair")
        assert len(seen) == 2 and all((r["blas"], r["omp"]) == (share, share) for r in seen.values()), seen
