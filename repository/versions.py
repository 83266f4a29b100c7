"""Which version directories of a model are served, per its version_policy."""
from __future__ import annotations

from tritonclient.grpc import model_config_pb2


def select_versions(config: model_config_pb2.ModelConfig, available: list[int]) -> list[int]:
    """Versions to load, ascending: latest{n} (default n=1), all{}, or specific{} listed and present."""
    present = sorted(set(available))
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return present
    if choice == "specific":
        return sorted(set(policy.specific.versions) & set(present))
    n = policy.latest.num_versions if choice == "latest" else 1
    return present[-n:] if n > 0 else []
