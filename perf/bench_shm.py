#!/usr/bin/env python3
"""Shared-memory benchmark: does passing a tensor by shared-memory key stay flat as it grows?

For inputs of 64 KB, 1 MB, 4 MB and 16 MB (FP32) on a Python identity model (max_batch_size
0, dims [-1]) it measures, in one run and one request at a time, p50 latency of
  HTTP binary      tritonclient.http, input and output in the request/response body
  gRPC             tritonclient.grpc, raw_input_contents / raw_output_contents
  shm over HTTP    input and output in registered system shared-memory regions
  shm over gRPC    the same over gRPC
  in-place/HTTP    output requested into the very bytes that hold the input
  shm/HTTP ONNX    shm/HTTP on an ONNX Runtime Identity over FP32 [N] (the ONNX backend's path)
then prints how flat each shared-memory path stays: its 16 MB p50 against 1.3x its 64 KB p50
plus one memcpy of 16 MB whose ends are not in cache (measured in this run), and gRPC / shm at
16 MB (goal >= 5). The shm
client fills its input region once, as a producer that writes straight into shared memory would,
and does not copy the output out; the server reads the input in place and the identity's output
is copied once, into the output region (that one memcpy is the only cost that grows with size;
in-place has none, the worker sees the output already where it must go). The body paths take
turns among themselves and the region paths among themselves, so what a 16 MB body leaves to
free after its answer lands on the next body request, not on a region one.
Last, perf_analyzer's infer/s on the identity model (16 FP32) at concurrency 1, 4 and 16
over HTTP and gRPC, when perf_analyzer is installed.

  python perf/bench_shm.py --start                       # tritond on a temporary repository
  python perf/bench_shm.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001   # a running server
                                                         # started with --allow-client-shm=true
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from bench_core import READY_TIMEOUT_S, ROOT, Server, ServerStartError

MODEL = "identity_fp32"
ONNX_MODEL = "identity_onnx"    # the same tensors through ONNX Runtime (an Identity graph)
SIZES = ((64 << 10, "64 KB"), (1 << 20, "1 MB"), (4 << 20, "4 MB"), (16 << 20, "16 MB"))
PATHS = ("HTTP binary", "gRPC", "shm/HTTP", "shm/gRPC", "in-place/HTTP", "shm/HTTP ONNX")
THROUGHPUT = re.compile(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec")


class ShmServer(Server):
    """bench_core's Server with client shared memory allowed, ready once gRPC answers too."""

    def __init__(self, repository: Path, log_path: Path):
        super().__init__(repository, log_path, ["--allow-client-shm=true"])

    def wait_ready(self, timeout: float) -> None:
        super().wait_ready(timeout)
        client = grpcclient.InferenceServerClient(self.grpc)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise ServerStartError(f"gRPC not ready after {timeout:g} s:\n{self.log_tail()}") from None
            time.sleep(0.2)
        client.close()


def make_repository(dest: Path) -> Path:
    shutil.copytree(ROOT / "examples" / "model_repository" / MODEL, dest / MODEL)
    write_onnx_identity(dest / ONNX_MODEL)
    return dest


def write_onnx_identity(model_dir: Path) -> None:
    """An ONNX Identity over FP32 [N]: ONNX Runtime's path for a tensor of any size (the output's
    dim named as the input's, so its shape is known before the run and it can be bound)."""
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(
        f'name: "{ONNX_MODEL}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [-1] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [-1] }]\n'
        'instance_group [{ kind: KIND_CPU, count: 1 }]\n')


def cold_memcpy_ms(nbytes: int, reps: int = 15) -> float:
    """Median time of one copy of `nbytes` whose source and destination are not in the CPU's
    caches (a larger buffer is read between copies, so no dirty line of it is left to write
    back), as a server's copy of a client's tensor finds them: the floor of "one copy at
    memory bandwidth"."""
    src = np.ones(nbytes, np.uint8)
    dst = np.ones_like(src)
    evict = np.ones(max(8 * nbytes, 256 << 20), np.uint8)
    times = []
    for _ in range(reps):
        evict.max()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def p50_ms(calls: dict, requests: int, warmup: int) -> dict[str, float]:
    """Median latency per call; the calls take turns, so load from elsewhere on the host
    hits every path alike and the ratios between them hold."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(requests):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def body_call(client, mod, x: np.ndarray, http: bool):
    inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
    if http:
        inp.set_data_from_numpy(x, binary_data=True)
        out = [mod.InferRequestedOutput("OUTPUT0", binary_data=True)]
    else:
        inp.set_data_from_numpy(x)
        out = [mod.InferRequestedOutput("OUTPUT0")]

    def call():
        result = client.infer(MODEL, [inp], outputs=out)
        assert result.as_numpy("OUTPUT0").shape == x.shape
    return call


class Regions:
    """An input and an output region of `nbytes`, registered on both protocols' clients."""

    def __init__(self, clients: list, x: np.ndarray) -> None:
        self.clients = clients
        self.names = [f"bench_in_{secrets.token_hex(3)}", f"bench_out_{secrets.token_hex(3)}"]
        self.handles = [shm.create_shared_memory_region(n, "/" + n, x.nbytes) for n in self.names]
        shm.set_shared_memory_region(self.handles[0], [x])
        for c in clients:
            for n in self.names:
                c.register_system_shared_memory(n, "/" + n, x.nbytes)

    def call(self, client, mod, x: np.ndarray, in_place: bool = False, model: str = MODEL):
        inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_shared_memory(self.names[0], x.nbytes)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(self.names[0 if in_place else 1], x.nbytes)
        return lambda: client.infer(model, [inp], outputs=[out])

    def check(self, x: np.ndarray) -> None:
        got = shm.get_contents_as_numpy(self.handles[1], np.float32, list(x.shape))
        if not np.array_equal(got, x):
            raise RuntimeError("the output region does not hold the identity of the input")

    def close(self) -> None:
        for c in self.clients:
            for n in self.names:
                c.unregister_system_shared_memory(n)
        for h in self.handles:
            shm.destroy_shared_memory_region(h)


def latency_table(http: str, grpc: str, args) -> tuple[dict, str]:
    hc = httpclient.InferenceServerClient(http, network_timeout=300)
    gc = grpcclient.InferenceServerClient(grpc)
    rows: dict[str, dict[str, float]] = {}
    onnx = hc.is_model_ready(ONNX_MODEL)      # a running server given by address may lack it
    paths = [p for p in PATHS if onnx or "ONNX" not in p]
    try:
        for nbytes, label in SIZES:
            x = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
            n = args.requests if nbytes < (4 << 20) else max(args.requests // 2, 10)
            regions = Regions([hc], x)
            try:
                row = p50_ms({"HTTP binary": body_call(hc, httpclient, x, True),
                              "gRPC": body_call(gc, grpcclient, x, False)}, n, args.warmup)
                calls = {"shm/HTTP": regions.call(hc, httpclient, x),
                         "shm/gRPC": regions.call(gc, grpcclient, x),
                         "in-place/HTTP": regions.call(hc, httpclient, x, in_place=True)}
                if onnx:
                    calls["shm/HTTP ONNX"] = regions.call(hc, httpclient, x, model=ONNX_MODEL)
                row.update(p50_ms(calls, n, args.warmup))
                regions.check(x)
            finally:
                regions.close()
            rows[label] = row
            print(f"  {label}: " + "  ".join(f"{k} {v:.2f} ms" for k, v in row.items()), file=sys.stderr)
    finally:
        hc.close()
        gc.close()
    lines = [f"p50 latency (ms), one request at a time, {MODEL} (Python; {ONNX_MODEL}: ONNX Runtime), "
             "FP32 input of",
             f"{'size':>8} " + "".join(f"{p:>15}" for p in paths)]
    for label, row in rows.items():
        lines.append(f"{label:>8} " + "".join(f"{row[p]:>15.2f}" for p in paths))
    small, big = rows[SIZES[0][1]], rows[SIZES[-1][1]]
    copy_ms = cold_memcpy_ms(SIZES[-1][0])
    lines.append("")
    lines.append(f"one memcpy of 16 MB on this host, neither side in cache: {copy_ms:.2f} ms")
    for path in paths[2:]:
        copies = 0 if path.startswith("in-place") else 1
        bound = 1.3 * small[path] + copies * copy_ms
        lines.append(f"{path}: 16 MB / 64 KB = {big[path] / small[path]:.2f}x; 16 MB {big[path]:.2f} ms against "
                     f"1.3 x 64 KB + {copies} copy = {bound:.2f} ms ({'met' if big[path] <= bound else 'missed'})   "
                     f"gRPC / {path} at 16 MB = {big['gRPC'] / big[path]:.1f}x (goal >= 5)   "
                     f"HTTP binary / {path} at 16 MB = {big['HTTP binary'] / big[path]:.1f}x")
    for path in ("HTTP binary", "gRPC"):
        lines.append(f"{path}: 16 MB / 64 KB = {big[path] / small[path]:.1f}x")
    return rows, "\n".join(lines)


def perf_analyzer() -> str | None:
    found = shutil.which("perf_analyzer")
    local = ROOT / ".venv" / "perf_analyzer" / "perf_analyzer"
    return found or (str(local) if os.access(local, os.X_OK) else None)


def perf_analyzer_table(http: str, grpc: str, args) -> str:
    """Time-window measurements (--request-count rounds its clock to whole seconds, which
    understates throughput); a loose stability bound, and one retry, keep a noisy host from
    failing the run."""
    exe = perf_analyzer()
    if exe is None:
        return "perf_analyzer: not installed (bash scripts/install-perf-analyzer .venv/perf_analyzer); skipped"
    lines = ["perf_analyzer infer/s, identity_fp32, 16 FP32",
             f"{'concurrency':>12}{'HTTP':>10}{'gRPC':>10}"]
    for c in args.pa_concurrency:
        row = []
        for protocol, url in (("http", http), ("grpc", grpc)):
            cmd = [exe, "-m", MODEL, "-u", url, "-i", protocol, "--shape", "INPUT0:16",
                   "--concurrency-range", str(c), "-p", str(args.pa_window_ms), "-r", "5", "-s", "50"]
            for _ in range(2):
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                found = THROUGHPUT.findall(proc.stdout)
                if proc.returncode == 0 and found:
                    break
            row.append(f"{float(found[-1][1]):>10.0f}" if proc.returncode == 0 and found else f"{'unstable':>10}")
        lines.append(f"{c:>12}" + "".join(row))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", action="store_true", help="start tritond on free ports and stop it afterwards")
    p.add_argument("--http", help="host:port of a running server's HTTP endpoint")
    p.add_argument("--grpc", help="host:port of the same server's gRPC endpoint")
    p.add_argument("--requests", type=int, default=60, help="measured requests per point (half for >= 4 MB)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured requests per point")
    p.add_argument("--pa-concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16])
    p.add_argument("--pa-window-ms", type=int, default=2000, help="perf_analyzer measurement window")
    args = p.parse_args()
    if not args.start and not (args.http and args.grpc):
        p.error("give --start, or both --http and --grpc")

    with tempfile.TemporaryDirectory(prefix="bench_shm_") as tmp:
        server = None
        try:
            if args.start:
                server = ShmServer(make_repository(Path(tmp) / "models"), Path(tmp) / "tritond.log")
                server.wait_ready(READY_TIMEOUT_S)
            http, grpc = (server.http, server.grpc) if server else (args.http, args.grpc)
            _, latency = latency_table(http, grpc, args)
            throughput = perf_analyzer_table(http, grpc, args)
        except ServerStartError as exc:
            sys.exit(str(exc))
        finally:
            if server is not None:
                server.stop()
    print(latency)
    print()
    print(throughput)


if __name__ == "__main__":
    main()
