#!/usr/bin/env python3
"""A worker's own CPU per request, without sockets: decode an Exec, execute it, encode the
BatchDone, in one process, as the worker loop does for every batch it receives.

The servers' benchmarks (bench_cpu, bench_broker) measure the whole request path and move
with the host's load; this one isolates the worker's Python path (wire decode, tensor views,
the backend's request and response objects, output descriptors), so a change to it shows
even on a busy host. It loads examples/model_repository's identity_fp32 (Python backend,
model.py through pb_utils) and a config of the built-in `identity` backend, and sends 16 FP32
inline, `--requests` requests per Exec. The figure is process CPU time per request, the best
of `--rounds`.

  python perf/bench_worker.py
  python perf/bench_worker.py --requests 32 --n 2000
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tritond.repository.config import load_model_config
from tritond.repository.layout import ModelSource
from tritond.repository.render import config_to_json
from tritond.wire import schema as P
from tritond.workers.main import Worker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
IDENTITY_CONFIG = """name: "identity_builtin"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def worker(repository: Path, model: str, endpoint: str) -> Worker:
    """A loaded worker whose sockets lead nowhere (nothing is sent on them here)."""
    source = ModelSource(model, str(repository / model), str(repository))
    spec = P.WorkerSpec(
        server_id=f"bench{os.getpid()}", workers=endpoint, identity=f"{model}:0:1", broker_pid=os.getppid(),
        model=model, version=1, model_dir=source.path, version_dir=f"{source.path}/1", repository=str(repository),
        config=config_to_json(load_model_config(source)), instance_name=f"{model}_0")
    return Worker(spec)


def per_request_us(w: Worker, backend, requests: int, n: int, rounds: int) -> float:
    """Best round's CPU µs per request over n Execs of `requests` requests each."""
    data = np.arange(16, dtype=np.float32).tobytes()
    frames = [P.encode(P.Exec(b, [P.ExecRequest([P.TensorDesc("INPUT0", "FP32", [16], P.Inline(data))],
                                               [P.OutputSpec("OUTPUT0")], key=b * requests + k)
                                  for k in range(requests)]))
              for b in range(256)]
    decode, encode = w.decoder.decode, P.encode

    def turns(count: int) -> None:
        for i in range(count):
            encode(w.execute(backend, decode(frames[i & 255])))

    turns(n // 10)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        turns(n)
        best = min(best, (time.process_time() - t0) / (n * requests) * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1, help="requests per Exec")
    parser.add_argument("--n", type=int, default=20000, help="Execs per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        builtin = Path(tmp) / "identity_builtin"
        (builtin / "1").mkdir(parents=True)
        (builtin / "config.pbtxt").write_text(IDENTITY_CONFIG)
        print("| model | requests/Exec | worker CPU µs/request |\n|---|---:|---:|")
        for repository, model in ((EXAMPLES, "identity_fp32"), (Path(tmp), "identity_builtin")):
            w = worker(repository, model, f"ipc://{tmp}/nobody")
            try:
                backend, _ = w.load()
                us = per_request_us(w, backend, args.requests, args.n, args.rounds)
                backend.close()
            finally:
                w.close()
            print(f"| {model} | {args.requests} | {us:.2f} |")


if __name__ == "__main__":
    main()
