"""Files `tritond analyze` leaves behind: a CSV row per measured point (what was asked, what
the server's config API reported, what was measured) and the winning config as pbtxt."""
from __future__ import annotations

import csv
from pathlib import Path

from google.protobuf import json_format, text_format

from tritond.repository.config import parse_config_text
from tritond.repository.render import config_from_json

from .objective import Objective
from .space import Candidate, apply, from_config
from .sweep import Point, Sweep

REQUESTED = ["instances", "max_batch_size", "dynamic_batching", "max_queue_delay_us", "preferred_batch_size",
             "intra_op_thread_count"]
MEASURED = ["concurrency", "infer_per_sec", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "avg_ms", "client_send_us",
            "client_recv_us", "server_queue_us", "server_compute_input_us", "server_compute_infer_us",
            "server_compute_output_us", "avg_batch_size", "batch_sizes", "memory_mb", "stable", "windows", "errors"]
COLUMNS = ["trial", "phase", *REQUESTED, *[f"server_{c}" for c in REQUESTED], *MEASURED, "feasible", "violations",
           "problems"]


def batch_histogram(point: Point) -> dict[int, int]:
    s = point.result.server
    return dict(sorted(s.batches.items())) if s is not None else {}


def _row(trial_id: int, candidate: Candidate, server_config: dict, problems: list[str], point: Point | None,
         objective: Objective) -> dict:
    row = {"trial": trial_id, "phase": point.phase if point else "search", **candidate.fields()}
    if server_config:
        row.update({f"server_{k}": v for k, v in from_config(server_config).fields().items()})
    if point is not None:
        r, s = point.result, point.result.server
        row.update({
            "concurrency": point.concurrency, "infer_per_sec": f"{r.infer_per_sec:.2f}",
            **{f"p{p}_ms": f"{r.percentiles_ns[p] / 1e6:.3f}" for p in (50, 90, 95, 99)},
            "avg_ms": f"{r.avg_latency_ns / 1e6:.3f}", "client_send_us": r.avg_send_ns // 1000,
            "client_recv_us": r.avg_recv_ns // 1000,
            "memory_mb": "" if point.memory_mb is None else f"{point.memory_mb:.1f}",
            "stable": r.stable, "windows": r.windows, "errors": r.errors,
            "feasible": objective.feasible(point), "violations": "; ".join(objective.violations(point)),
        })
        if s is not None:
            row.update({"server_queue_us": s.avg_queue_ns // 1000,
                        "server_compute_input_us": s.avg_compute_input_ns // 1000,
                        "server_compute_infer_us": s.avg_compute_infer_ns // 1000,
                        "server_compute_output_us": s.avg_compute_output_ns // 1000,
                        "avg_batch_size": f"{s.avg_batch_size:.2f}",
                        "batch_sizes": ";".join(f"{k}:{v}" for k, v in batch_histogram(point).items())})
    row["problems"] = "; ".join(problems)
    return row


def write_trials_csv(path: Path, sweep: Sweep) -> None:
    """Every measured point (and every trial that could not be measured, with the reason)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        for t in sweep.trials:
            for p in t.points or [None]:
                writer.writerow(_row(t.id, t.candidate, t.server_config, t.problems, p, sweep.objective))
        by_id = {t.id: t for t in sweep.trials}
        for p in sweep.reruns:
            t = by_id[p.config_id]
            writer.writerow(_row(t.id, t.candidate, t.server_config, [], p, sweep.objective))


def config_text(candidate: Candidate, server_config: dict, original: Path | None, comment: str) -> str:
    """The winning config as pbtxt: the model's own config file with the swept fields changed
    (so auto-completed parts stay auto-completed), or the server's full config without a file."""
    if original is not None and original.is_file():
        proto = parse_config_text(original.read_text(), server_config.get("name", ""), str(original))
        base = json_format.MessageToDict(proto, preserving_proto_field_name=True)
    else:
        base = server_config
    kind = ((server_config.get("instance_group") or [{}])[0]).get("kind", "KIND_CPU")
    proto = config_from_json(apply(base, candidate, kind))
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    return header + text_format.MessageToString(proto)
