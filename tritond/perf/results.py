"""perf_analyzer's outputs for measured levels: the `-f` CSV (same columns, same arithmetic,
rows in increasing throughput) and the console summary."""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from .engine import LevelResult


def _number(value: float) -> str:
    """A float as C++ streams print one (6 significant digits), as perf_analyzer writes it."""
    return f"{value:g}"


def csv_header(results: Sequence[LevelResult], verbose: bool = False, percentile: int = -1) -> list[str]:
    mode = "Concurrency" if results[0].mode == "concurrency" else "Request Rate"
    cols = [mode, "Inferences/Second", "Client Send"]
    if results[0].server is not None:
        cols += ["Network+Server Send/Recv", "Server Queue", "Server Compute Input",
                 "Server Compute Infer", "Server Compute Output"]
    cols.append("Client Recv")
    cols += [f"p{p} latency" for p in sorted(results[0].percentiles_ns)]
    if verbose:
        if percentile < 0:
            cols.append("Avg latency")
        cols += ["request/response", "response wait"]
    return cols


def csv_row(r: LevelResult, verbose: bool = False, percentile: int = -1) -> list[str]:
    level = str(int(r.level)) if r.mode == "concurrency" else _number(r.level)
    row = [level, _number(r.infer_per_sec), str(r.avg_send_ns // 1000)]
    if r.server is not None:
        s = r.server
        client_wait = r.avg_latency_ns - r.avg_send_ns - r.avg_recv_ns
        accounted = s.avg_queue_ns + s.avg_compute_ns
        network = client_wait - accounted if client_wait > accounted else 0
        row += [str(network // 1000), str(s.avg_queue_ns // 1000), str(s.avg_compute_input_ns // 1000),
                str(s.avg_compute_infer_ns // 1000), str(s.avg_compute_output_ns // 1000)]
    row.append(str(r.avg_recv_ns // 1000))
    row += [str(r.percentiles_ns[p] // 1000) for p in sorted(r.percentiles_ns)]
    if verbose:
        if percentile < 0:
            row.append(str(r.avg_latency_ns // 1000))
        row += [str((r.avg_send_ns + r.avg_recv_ns) // 1000),
                str((r.avg_latency_ns - r.avg_send_ns - r.avg_recv_ns) // 1000)]
    return row


def write_csv(path: str, results: Sequence[LevelResult], verbose: bool = False, percentile: int = -1) -> None:
    """perf_analyzer's `-f` file; nothing is written for an empty run, as perf_analyzer does."""
    if not results:
        return
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(csv_header(results, verbose, percentile))
    for r in sorted(results, key=lambda r: r.infer_per_sec):
        writer.writerow(csv_row(r, verbose, percentile))
    with open(path, "w", newline="") as f:
        f.write(out.getvalue())


def level_label(r: LevelResult) -> str:
    return f"Concurrency: {int(r.level)}" if r.mode == "concurrency" else f"Request Rate: {_number(r.level)}"


def describe(r: LevelResult, percentile: int = -1) -> str:
    """The per-level block perf_analyzer prints (client, then server figures)."""
    lines = ["  Client: ", f"    Request count: {r.request_count}"]
    if r.delayed:
        lines.append(f"    Delayed Request Count: {r.delayed}")
    lines.append(f"    Throughput: {_number(r.infer_per_sec)} infer/sec")
    if percentile < 0:
        lines.append(f"    Avg latency: {r.avg_latency_ns // 1000} usec (standard deviation {r.std_us} usec)")
    lines += [f"    p{p} latency: {ns // 1000} usec" for p, ns in sorted(r.percentiles_ns.items())]
    if r.errors:
        lines.append(f"    Failed requests: {r.errors} (last error: {r.last_error})")
    if not r.stable:
        lines.append(f"    Unstable: no 3 consecutive windows within the stability percentage in {r.windows} windows")
    s = r.server
    if s is not None and s.success_count:
        overhead = max(s.avg_request_ns - s.avg_queue_ns - s.avg_compute_ns, 0)
        lines += ["  Server: ",
                  f"    Inference count: {s.inference_count}",
                  f"    Execution count: {s.execution_count}",
                  f"    Successful request count: {s.success_count}",
                  f"    Avg request latency: {s.avg_request_ns // 1000} usec (overhead {overhead // 1000} usec + "
                  f"queue {s.avg_queue_ns // 1000} usec + compute input {s.avg_compute_input_ns // 1000} usec + "
                  f"compute infer {s.avg_compute_infer_ns // 1000} usec + "
                  f"compute output {s.avg_compute_output_ns // 1000} usec)"]
    return "\n".join(lines)


def summary_lines(results: Sequence[LevelResult], percentile: int = -1) -> list[str]:
    """perf_analyzer's closing lines: `Concurrency: N, throughput: X infer/sec, latency Y usec`."""
    what = "Average" if percentile < 0 else f"p{percentile}"
    out = [f"Inferences/Second vs. Client {what} Batch Latency"]
    for r in results:
        out.append(f"{level_label(r)}, throughput: {_number(r.infer_per_sec)} infer/sec, "
                   f"latency {r.latency_ns(percentile) // 1000} usec" + ("" if r.stable else " (unstable)"))
    return out
