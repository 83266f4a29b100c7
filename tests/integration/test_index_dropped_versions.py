"""A version a reload drops (the version policy selects a newer one) stays in the repository
index as UNAVAILABLE "unloaded", as Triton lists it (L0_storage_S3_local's poll case checks it),
and leaves the list when it is served again."""
from __future__ import annotations

import shutil

import tritonclient.http as httpclient

from conftest import TritondServer, serving
from fault_models import add_fault_model


def versions(client: httpclient.InferenceServerClient) -> list[dict]:
    return [e for e in client.get_model_repository_index() if e["name"] == "m"]


def test_a_dropped_version_is_listed_unloaded_until_it_serves_again(tmp_path):
    repo = tmp_path / "models"
    add_fault_model(repo, "m")
    with serving(TritondServer(repo, ["--model-control-mode=explicit", "--load-model=m"])) as s:
        client = httpclient.InferenceServerClient(s.http_url, network_timeout=120)
        try:
            assert versions(client) == [{"name": "m", "version": "1", "state": "READY"}]
            shutil.copytree(repo / "m" / "1", repo / "m" / "2")
            client.load_model("m")
            assert versions(client) == [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                                        {"name": "m", "version": "2", "state": "READY"}]
            assert [e["version"] for e in client.get_model_repository_index() if e.get("state") == "READY"
                    and e["name"] == "m"] == ["2"]
            shutil.rmtree(repo / "m" / "2")
            client.load_model("m")
            assert versions(client) == [{"name": "m", "version": "1", "state": "READY"},
                                        {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}]
        finally:
            client.close()
