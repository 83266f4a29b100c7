"""A model's `model_metrics`: Triton's per-model histogram buckets.

Triton lets a config override the buckets of its customizable histograms; the one family Triton
core customizes is the first-response histogram (`--metrics-config histogram_latencies=true`).
A control for any other family is accepted with a warning, as Triton does.
"""
from __future__ import annotations

from typing import Any, Callable

from tritonclient.grpc import model_config_pb2

from .errors import ConfigError

FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"


def check_model_metrics(cfg: model_config_pb2.ModelConfig, fail: Callable[[str, str], ConfigError]) -> None:
    """Every metric control names a family and non-empty buckets (Triton's ValidateModelMetrics)."""
    for i, control in enumerate(cfg.model_metrics.metric_control):
        where = f"model_metrics.metric_control[{i}]"
        if not control.HasField("metric_identifier"):
            raise fail(where, "metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise fail(f"{where}.metric_identifier", "metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise fail(where, "metric control must specify 'histogram_options'")
        buckets = list(control.histogram_options.buckets)
        if not buckets:
            raise fail(f"{where}.histogram_options", "histogram options must specify non-empty 'buckets'")
        if any(b >= a for b, a in zip(buckets, buckets[1:])):      # a Prometheus histogram needs them so
            raise fail(f"{where}.histogram_options", f"histogram options 'buckets' must be strictly increasing, "
                                                     f"got {buckets}")


def model_metrics_warnings(cfg: model_config_pb2.ModelConfig) -> list[str]:
    """Triton's warning for each control of a family it does not customize."""
    return [f"Metric family '{c.metric_identifier.family}' in 'metric_identifier' is not a customizable metric "
            "in Triton core." for c in cfg.model_metrics.metric_control
            if c.metric_identifier.family != FIRST_RESPONSE_FAMILY]


def first_response_buckets(config: dict[str, Any] | None) -> tuple[float, ...] | None:
    """The first-response histogram's buckets a (dict) config sets, else None (the default)."""
    controls = ((config or {}).get("model_metrics") or {}).get("metric_control") or []
    found = None
    for control in controls:
        if (control.get("metric_identifier") or {}).get("family") == FIRST_RESPONSE_FAMILY:
            found = tuple(float(b) for b in (control.get("histogram_options") or {}).get("buckets") or ())
    return found
