#!/usr/bin/env python3
"""Density: what N models cost in memory and startup time, workers forked from warm templates
vs spawned with their own import, and against real Triton serving N Python-backend models.

Generated repositories of small models (1 instance each): ONNX ([-1,16] x 16x16 weights),
TorchScript (a Linear(16, 16)) and Python (identity). For each case and mode it starts the
server, times it to READY, sends one inference to every model, and measures the process tree:
total PSS (every page split among the processes sharing it), each worker's USS (the pages only
it holds), and the marginal cost per worker as the slope of total PSS over N.

  python perf/bench_density.py                                   # the issue's cases
  python perf/bench_density.py --cases onnx:10,python:50 --modes fork
  python perf/bench_density.py --triton-anchors /tmp/anchors     # add real Triton's column

Real Triton comes from ../shared/bench-anchors (run_anchors.sh prepares ANCHORS_DIR: the
tritonserver binary of the nvidia-pytriton wheel and its venv). That wheel bundles only the
Python backend, so Triton serves each model through it: an identity model.py, and for the
ONNX case a model.py running onnxruntime on the same model.onnx; TorchScript has no Triton
column (no torch in its venv, no libtorch backend in the wheel).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anchors import Triton
from tritond.frontend.metrics import tree

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600.0
MB = 1 << 20

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''
ONNX_VIA_PYTHON = '''
import os

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            (y,) = self.session.run(None, {"INPUT0": x})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return out
'''


def config(name: str, backend: str, in_name: str = "INPUT0", out_name: str = "OUTPUT0") -> str:
    field = f'platform: "{backend}"' if backend == "pytorch_libtorch" else f'backend: "{backend}"'
    return (f'name: "{name}"\n{field}\nmax_batch_size: 8\n'
            f'input [{{ name: "{in_name}" data_type: TYPE_FP32 dims: [ 16 ] }}]\n'
            f'output [{{ name: "{out_name}" data_type: TYPE_FP32 dims: [ 16 ] }}]\n'
            'instance_group [{ count: 1 kind: KIND_CPU }]\n')


def onnx_bytes(seed: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(seed).standard_normal((16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["OUTPUT0"])], "m",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def build(repo: Path, kind: str, n: int, for_triton: bool = False) -> list[str]:
    """A repository of `n` models of `kind`; returns their names."""
    if kind == "torch":
        import torch
        traced = torch.jit.trace(torch.nn.Linear(16, 16).eval(), torch.zeros(1, 16))
    names = []
    for i in range(n):
        name = f"{kind}_{i:03d}"
        d = repo / name / "1"
        d.mkdir(parents=True)
        if kind == "python" or (kind == "onnx" and for_triton):
            (d / "model.py").write_text(IDENTITY_PY if kind == "python" else ONNX_VIA_PYTHON)
            (repo / name / "config.pbtxt").write_text(config(name, "python"))
            if kind == "onnx":
                (d / "model.onnx").write_bytes(onnx_bytes(i))
        elif kind == "onnx":
            (d / "model.onnx").write_bytes(onnx_bytes(i))
            (repo / name / "config.pbtxt").write_text(config(name, "onnxruntime"))
        else:
            torch.jit.save(traced, str(d / "model.pt"))
            (repo / name / "config.pbtxt").write_text(config(name, "pytorch_libtorch", "INPUT__0", "OUTPUT__0"))
        names.append(name)
    return names


# ---------------------------------------------------------------- processes and memory

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory(pid: int) -> tuple[int, int]:
    """(PSS, USS) bytes."""
    pss = uss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    pss = int(rest.split()[0]) * 1024
                elif key in ("Private_Clean", "Private_Dirty"):
                    uss += int(rest.split()[0]) * 1024
    except OSError:
        pass
    return pss, uss


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Result:
    server: str
    kind: str
    n: int
    ready_s: float
    ok: int
    total_pss: int
    worker_uss: list[int]
    template_pss: int


def wait_ready(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"the server exited with {proc.returncode}:\n" + "\n".join(tail))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("not ready in time")


def infer_each(port: int, names: list[str], in_name: str) -> int:
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    ok = 0
    x = np.ones((1, 16), np.float32)
    for name in names:
        inp = httpclient.InferInput(in_name, [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        try:
            client.infer(name, [inp])
            ok += 1
        except Exception as e:  # reported as a count, the run goes on
            print(f"  {name}: {e}", file=sys.stderr)
    client.close()
    return ok


def measure(root_pid: int, worker_of) -> tuple[int, list[int], int]:
    total, workers, templates = 0, [], 0
    for pid in tree(root_pid):
        pss, uss = memory(pid)
        total += pss
        line = cmdline(pid)
        if worker_of(line):
            workers.append(uss)
        elif "tritond.workers.template" in line:
            templates += pss
    return total, workers, templates


def run_tritond(kind: str, n: int, fork: bool) -> Result:
    with tempfile.TemporaryDirectory(prefix="density-") as tmp:
        repo = Path(tmp) / "models"
        names = build(repo, kind, n)
        port = free_port()
        cmd = [str(ROOT / ".venv" / "bin" / "tritond"), "start", "--model-repository", str(repo),
               "--http-port", str(port), "--grpc-port", str(free_port()), "--allow-metrics=false",
               f"--worker-templates={'true' if fork else 'false'}"]
        log = open(Path(tmp) / "server.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = wait_ready(port, proc, READY_TIMEOUT_S, Path(tmp) / "server.log")
            ok = infer_each(port, names, "INPUT__0" if kind == "torch" else "INPUT0")
            time.sleep(1.0)
            total, workers, templates = measure(proc.pid, lambda line: line.startswith("tritond-worker"))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
        return Result("tritond fork" if fork else "tritond spawn", kind, n, ready, ok, total, workers, templates)


def run_triton(kind: str, n: int, anchors: Path) -> Result:
    with tempfile.TemporaryDirectory(prefix="density-triton-") as tmp:
        repo = Path(tmp) / "models"
        names = build(repo, kind, n, for_triton=True)
        triton = Triton(anchors, repo, Path(tmp) / "triton.log", ["--allow-metrics=false"])
        port = int(triton.http.rsplit(":", 1)[1])
        try:
            ready = wait_ready(port, triton.proc, READY_TIMEOUT_S, triton.log_path)
            ok = infer_each(port, names, "INPUT0")
            time.sleep(1.0)
            total, workers, _ = measure(triton.proc.pid, lambda line: "triton_python_backend_stub" in line)
        finally:
            triton.stop()
        return Result("Triton 2.51 (python backend)", kind, n, ready, ok, total, workers, 0)


def slope(points: list[tuple[int, int]]) -> float | None:
    if len(points) < 2:
        return None
    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    return float(np.polyfit(xs, ys, 1)[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="onnx:10,onnx:50,onnx:100,torch:4,torch:16,python:50",
                   help="kind:N,... (kinds: onnx, torch, python)")
    p.add_argument("--modes", default="fork,spawn", help="tritond modes: fork, spawn")
    p.add_argument("--triton-anchors", type=Path, help="ANCHORS_DIR prepared by bench-anchors/run_anchors.sh")
    args = p.parse_args()
    cases = [(k, int(n)) for k, n in (c.split(":") for c in args.cases.split(","))]
    results: list[Result] = []
    for kind, n in cases:
        for mode in args.modes.split(","):
            print(f"tritond {mode}: {kind} x {n} ...", file=sys.stderr, flush=True)
            results.append(run_tritond(kind, n, mode == "fork"))
        if args.triton_anchors and kind != "torch":
            print(f"triton: {kind} x {n} ...", file=sys.stderr, flush=True)
            results.append(run_triton(kind, n, args.triton_anchors))
    print("| server | models | N | time to READY s | inferences ok | total PSS MB | mean worker USS MB "
          "| templates PSS MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        uss = sum(r.worker_uss) / len(r.worker_uss) / MB if r.worker_uss else 0.0
        print(f"| {r.server} | {r.kind} | {r.n} | {r.ready_s:.1f} | {r.ok}/{r.n} | {r.total_pss / MB:.0f} "
              f"| {uss:.1f} | {r.template_pss / MB:.0f} |")
    print()
    print("| server | models | marginal PSS per worker MB (slope over N) | x Triton |")
    print("|---|---|---:|---:|")
    by = {}
    for r in results:
        by.setdefault((r.server, r.kind), []).append((r.n, r.total_pss))
    triton = {k: slope(v) for (s, k), v in by.items() if s.startswith("Triton")}
    for (server, kind), points in by.items():
        s = slope(points)
        if s is None:
            continue
        t = triton.get(kind)
        ratio = f"{s / t:.2f}" if t and not server.startswith("Triton") else "-"
        print(f"| {server} | {kind} | {s / MB:.1f} | {ratio} |")
    print()
    print("Same N, total PSS tritond / Triton:", json.dumps({
        f"{r.kind}:{r.n}:{r.server}": round(r.total_pss / t.total_pss, 2)
        for r in results for t in results
        if t.server.startswith("Triton") and not r.server.startswith("Triton") and (r.kind, r.n) == (t.kind, t.n)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
