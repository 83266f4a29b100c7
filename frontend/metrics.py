"""Prometheus text exposition with Triton's metric names, from the broker's statistics."""
from __future__ import annotations

from typing import Any

COUNTERS = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     lambda s: s["inference_stats"]["fail"]["count"]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: (s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"]) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_output"]["ns"] // 1000),
    ("tritond_model_restart_count", "Number of times a worker of this model was restarted after dying",
     lambda s: s.get("restart_count", 0)),
]
GAUGES = [
    ("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.",
     lambda s: s.get("pending", 0)),
    ("tritond_model_ready_instances", "Number of instances of this model able to serve",
     lambda s: s.get("instances_ready", 0)),
    ("nv_model_load_duration_secs", "Model load time in seconds", lambda s: s.get("load_duration_secs", 0)),
]


def render(stats: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for kind, table in (("counter", COUNTERS), ("gauge", GAUGES)):
        for name, help_text, get in table:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for s in stats:
                labels = f'model="{s["name"]}",version="{s["version"]}"'
                if name == "nv_inference_request_failure":
                    labels += ',reason="OTHER"'
                lines.append(f"{name}{{{labels}}} {get(s)}")
    return "\n".join(lines) + "\n"
