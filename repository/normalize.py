"""Triton's config normalization: the defaults a loaded model's config shows.

GET config must show what Triton shows (version policy, preferred batch size,
instance groups, ...), and schedulers read these fields without re-deriving
defaults. Run again after a backend (e.g. a Python model's
`auto_complete_config`) changes the config.
"""
from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from . import devices
from .backends import ENSEMBLE_PLATFORM, ONNXRUNTIME, OPENVINO

Kind = model_config_pb2.ModelInstanceGroup.Kind

SEQUENCE_IDLE_DEFAULT_US = 1_000_000


def default_instance_count(kind: int, backend: str) -> int:
    """Triton's default count: 2 CPU instances for onnxruntime, else 1."""
    return 2 if kind == Kind.KIND_CPU and backend == ONNXRUNTIME else 1


def _normalize_instance_groups(cfg: model_config_pb2.ModelConfig) -> None:
    gpus = devices.gpu_count()
    if not cfg.instance_group:
        cfg.instance_group.add(name=cfg.name)
    for idx, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{idx}"
        if group.kind == Kind.KIND_AUTO:
            # OpenVINO runs on the CPU only; Triton's backend prefers KIND_CPU for AUTO groups.
            usable = gpus > 0 and all(0 <= g < gpus for g in group.gpus) and cfg.backend != OPENVINO
            group.kind = Kind.KIND_GPU if usable else Kind.KIND_CPU
        if group.count < 1:
            group.count = default_instance_count(group.kind, cfg.backend)
        if group.kind == Kind.KIND_GPU and not group.gpus:
            group.gpus.extend(range(gpus))


def normalize_config(cfg: model_config_pb2.ModelConfig) -> None:
    """Apply Triton's defaults in place; idempotent."""
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    if cfg.HasField("dynamic_batching"):
        if not cfg.dynamic_batching.preferred_batch_size and cfg.max_batch_size > 0:
            cfg.dynamic_batching.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        seq = cfg.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size and cfg.max_batch_size > 0:
            seq.oldest.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.platform == ENSEMBLE_PLATFORM or cfg.HasField("ensemble_scheduling"):
        # Triton's ensemble validation always sets the policy (decoupled when a step is)
        cfg.model_transaction_policy.SetInParent()
        return
    for pinned in ("input_pinned_memory", "output_pinned_memory"):
        if not cfg.optimization.HasField(pinned):
            getattr(cfg.optimization, pinned).enable = True
    _normalize_instance_groups(cfg)
