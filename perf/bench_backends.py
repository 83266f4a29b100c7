#!/usr/bin/env python3
"""The server's overhead per backend: the example MLP (256-1024-1024-256, [1,256] FP32) on
ONNX Runtime, OpenVINO, TorchScript and TensorFlow, through tritond and called in-process.

1. One tritond serves `mlp_onnx`, `mlp_openvino`, `mlp_torch` and `mlp_tensorflow` (each one
   CPU instance, one compute thread, dynamic batching with a 200 us delay, as the example
   configs say); the closed-loop load generator drives each over HTTP (binary tensors) at
   every concurrency level.
2. With the server stopped, each framework runs the same model in this process with the same
   settings: one thread calling it back to back (c=1), or N threads each calling it on their
   own (c=N).

Prints requests/s and p50/p99 for both, the ratio tritond/in-process and the per-request
overhead (tritond p50 - in-process p50). Models whose framework is not installed are left out.

  python perf/bench_backends.py [--concurrency 1,16] [--duration 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

import bench_core
from tritond.perf import loadgen

WIDTH = 256
MODELS = {  # model -> (framework label, input name)
    "mlp_onnx": ("ONNX Runtime", "INPUT0"),
    "mlp_openvino": ("OpenVINO", "INPUT0"),
    "mlp_torch": ("TorchScript", "INPUT__0"),
    "mlp_tensorflow": ("TensorFlow", "INPUT0"),
}


def onnx_caller(repo: Path) -> Callable[[], Callable]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(repo / "mlp_onnx" / "1" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    return lambda: (lambda x: session.run(None, {"INPUT0": x})[0])


def openvino_caller(repo: Path) -> Callable[[], Callable]:
    import openvino as ov

    from tritond.workers.backends.openvino import compile_properties

    config = {"parameters": {k: {"string_value": v} for k, v in
                             (("INFERENCE_NUM_THREADS", "1"), ("NUM_STREAMS", "1"), ("PERFORMANCE_HINT", "LATENCY"))}}
    compiled = ov.Core().compile_model(str(repo / "mlp_openvino" / "1" / "model.xml"), "CPU",
                                       compile_properties(ov, config))

    def new():
        request = compiled.create_infer_request()
        return lambda x: request.infer({"INPUT0": x}, share_inputs=True)[0]
    return new


def torch_caller(repo: Path) -> Callable[[], Callable]:
    import torch

    torch.set_num_threads(1)
    module = torch.jit.load(str(repo / "mlp_torch" / "1" / "model.pt"))

    def call(x):
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()
    return lambda: call


def tensorflow_caller(repo: Path) -> Callable[[], Callable]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    function = tf.saved_model.load(str(repo / "mlp_tensorflow" / "1" / "model.savedmodel")).signatures["serving_default"]
    return lambda: (lambda x: function(INPUT0=tf.constant(x))["OUTPUT0"].numpy())


CALLERS = {"mlp_onnx": onnx_caller, "mlp_openvino": openvino_caller, "mlp_torch": torch_caller,
           "mlp_tensorflow": tensorflow_caller}


def in_process(factory: Callable[[], Callable], x: np.ndarray, threads: int, seconds: float, warmup: float):
    """(calls/s, p50 ms, p99 ms) of `threads` threads each calling its own caller back to back."""
    times: list[list[float]] = [[] for _ in range(threads)]
    start = time.perf_counter() + warmup
    stop = start + seconds

    def loop(i: int) -> None:
        call = factory()
        while (t0 := time.perf_counter()) < stop:
            call(x)
            if t0 >= start:
                times[i].append(time.perf_counter() - t0)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    flat = np.array([t for ts in times for t in ts]) * 1e3
    return len(flat) / seconds, float(np.percentile(flat, 50)), float(np.percentile(flat, 99))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per point")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_backends_") as tmp:
        repo = Path(tmp) / "models"
        bench_core.build_repository(repo, tuple(MODELS))
        models = [m for m in MODELS if (repo / m).is_dir()]
        server = bench_core.Server(repo, Path(tmp) / "tritond.log")
        served = {}
        try:
            server.wait_ready(bench_core.READY_TIMEOUT_S)
            for model in models:
                inputs = [loadgen.make_input(MODELS[model][1], (1, WIDTH), "FP32")]
                for c in args.concurrency:
                    served[model, c] = loadgen.run(server.http, "http", model, inputs, c, args.duration,
                                                   args.warmup, True)
        except (bench_core.ServerStartError, loadgen.LoadgenError) as exc:
            sys.exit(str(exc))
        finally:
            server.stop()
        x = loadgen.make_input("INPUT0", (1, WIDTH), "FP32").data
        lines = ["| backend | conc | tritond infer/s | p50 ms | p99 ms | errors | in-process calls/s | p50 ms | "
                 "p99 ms | tritond / in-process | overhead p50 us |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for model in models:
            factory = CALLERS[model](repo)
            for c in args.concurrency:
                r = served[model, c]
                calls, p50, p99 = in_process(factory, x, c, args.duration, args.warmup)
                lines.append(f"| {MODELS[model][0]} | {c} | {r.infer_per_s:,.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} "
                             f"| {r.errors} | {calls:,.0f} | {p50:.3f} | {p99:.3f} | {r.infer_per_s / calls:.2f} "
                             f"| {(r.p50_ms - p50) * 1e3:,.0f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
