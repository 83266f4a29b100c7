"""Running NVIDIA's perf_analyzer for `tritond perf` when it is installed: the same options
become its command line, its output passes through, its `-f` CSV is the result.

`scripts/install-perf-analyzer` puts it in `<venv>/perf_analyzer/`; PATH is searched first.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .session import PerfOptions

LEVEL_LINE = re.compile(r"^Request (?:concurrency: (\d+)|Rate: ([0-9.]+))")
PASS_LINE = re.compile(r"^\s*Pass \[(\d+)\] throughput: ([0-9.]+) infer/sec\. (?:Avg|p\d+) latency: (\d+) usec")


def find_perf_analyzer() -> str | None:
    found = shutil.which("perf_analyzer")
    if found:
        return found
    local = Path(sys.prefix) / "perf_analyzer" / "perf_analyzer"
    return str(local) if os.access(local, os.X_OK) else None


def command(binary: str, opts: PerfOptions, range_flag: str, range_text: str, csv_path: str | None,
            verbose_csv: bool) -> list[str]:
    """perf_analyzer's command line for the same measurement."""
    m = opts.measure
    cmd = [binary, "-m", opts.model, "-u", opts.url, "-i", opts.protocol, "-b", str(opts.batch_size),
           f"--{range_flag}", range_text,
           "--measurement-interval", str(int(round(m.interval_s * 1000))),
           "--stability-percentage", f"{m.stability * 100:g}", "--max-trials", str(m.max_trials),
           "--input-data", opts.input_data, "--shared-memory", opts.shared_memory,
           "--output-shared-memory-size", str(opts.output_shm_size), "--string-length", str(opts.string_length)]
    if opts.version:
        cmd += ["-x", opts.version]
    if m.percentile > 0:
        cmd += ["--percentile", str(m.percentile)]
    if range_flag == "request-rate-range":
        cmd += ["--request-distribution", opts.request_distribution]
    for name, dims in opts.shapes.items():
        cmd += ["--shape", f"{name}:{','.join(map(str, dims))}"]
    if opts.string_data is not None:
        cmd += ["--string-data", opts.string_data]
    if opts.protocol == "http":
        cmd += ["--input-tensor-format", opts.input_format]
    if csv_path:
        cmd += ["-f", csv_path]
        if verbose_csv:
            cmd.append("--verbose-csv")
    cmd.append("-v")   # per-window lines drive the progress display
    return cmd


def run(cmd: Sequence[str], on_level: Callable[[float], None], on_pass: Callable[[int, float, float], None],
        echo: Callable[[str], None]) -> int:
    """Run perf_analyzer, passing its report lines to `echo` and its progress to the callbacks."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            level = LEVEL_LINE.match(line)
            passed = PASS_LINE.match(line)
            if level:
                on_level(float(level.group(1) or level.group(2)))
            if passed:
                on_pass(int(passed.group(1)), float(passed.group(2)), int(passed.group(3)) * 1000.0)
            else:
                echo(line)
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
