#!/usr/bin/env python3
"""PyTorch benchmark: what does serving a TorchScript model cost compared to calling it in-process?

CPU (default): the example `mlp_torch` (256-1024-1024-256, [1,256] FP32 over HTTP binary)
through tritond at each concurrency level, then the same module called in a loop in this
process with the worker's thread count; prints requests/s, p50/p99, the ratio to the
in-process loop and the per-request overhead (server p50 at c=1 - in-process p50).

GPU (--gpu, needs a CUDA GPU and torch with CUDA):
  1. a weight-heavy TorchScript MLP on KIND_GPU with 1 instance, 2 instances, and 2 instances
     under --mps, at the same concurrency (throughput and ratio to 1 instance);
  2. the hand-off of one device tensor between two worker processes, by CUDA IPC handle
     (workers/cuda_ipc.py) vs through host shared memory (device->host, shm, host->device),
     per hand-off latency and ratio.

  python perf/bench_pytorch.py                 # CPU
  python perf/bench_pytorch.py --gpu           # GPU variants
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

import bench_core
from tritond.perf import loadgen

WIDTH = 256
GPU_WIDTH = 4096
GPU_LAYERS = 8
HANDOFF_BYTES = 16 << 20

GPU_CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ 0 ] }} ]
"""


def percentile_us(times: list[float], q: float) -> float:
    return float(np.percentile(np.array(times) * 1e6, q))


def in_process(model_path: Path, x: np.ndarray, seconds: float, threads: int, device: str = "cpu") -> tuple:
    """(p50 us, calls/s, p99 us) of module(x) called back to back, as the worker calls it."""
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(str(model_path), map_location=device)
    for _ in range(50):
        with torch.inference_mode():
            module(torch.from_numpy(x).to(device)).cpu().numpy()
    times = []
    start = time.perf_counter()
    while (begin := time.perf_counter()) - start < seconds:
        with torch.inference_mode():
            module(torch.from_numpy(x).to(device)).cpu().numpy()
        times.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - start
    return percentile_us(times, 50), len(times) / elapsed, percentile_us(times, 99)


def server_with(repository: Path, tmp: Path, extra: list[str]) -> bench_core.Server:
    """bench_core.Server with extra tritond options (e.g. --mps)."""
    return bench_core.Server(repository, tmp / f"tritond-{time.monotonic_ns()}.log", extra)


def measure(http: str, model: str, shape: tuple[int, ...], concurrency: list[int], args) -> list:
    inputs = [loadgen.make_input("INPUT__0", shape, "FP32")]
    return [(c, loadgen.run(http, "http", model, inputs, c, args.duration, args.warmup, True)) for c in concurrency]


def cpu_bench(args, tmp: Path) -> str:
    full = tmp / "example"
    bench_core.build_repository(full)
    if not (full / "mlp_torch").is_dir():
        sys.exit("torch is not importable here, so the example repository has no mlp_torch")
    repository = tmp / "models"
    repository.mkdir()
    shutil.copytree(full / "mlp_torch", repository / "mlp_torch")
    server = server_with(repository, tmp, [])
    try:
        server.wait_ready(bench_core.READY_TIMEOUT_S)
        rows = measure(server.http, "mlp_torch", (1, WIDTH), args.concurrency, args)
    finally:
        server.stop()
    x = loadgen.make_input("INPUT__0", (1, WIDTH), "FP32").data
    p50, calls, p99 = in_process(repository / "mlp_torch" / "1" / "model.pt", x, args.duration, args.threads)
    lines = ["| case | conc | infer/s | p50 ms | p99 ms | errors | x in-process |", "|---|---:|---:|---:|---:|---:|---:|"]
    for conc, r in rows:
        lines.append(f"| mlp_torch via tritond, HTTP binary, [1,256] f32 | {conc} | {r.infer_per_s:,.0f} "
                     f"| {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.errors} | {r.infer_per_s / calls:.2f} |")
    lines.append(f"| mlp_torch in-process torch.jit ({args.threads} thread) | 1 | {calls:,.0f} | {p50 / 1e3:.3f} "
                 f"| {p99 / 1e3:.3f} | 0 | 1.00 |")
    c1 = next((r for c, r in rows if c == 1), None)
    text = "\n".join(lines) + f"\n\nin-process: {p50:.1f} us per call, {calls:,.0f} calls/s"
    if c1 is not None:
        text += f"\nserver overhead per request (p50 at c=1 - in-process p50): {c1.p50_ms * 1e3 - p50:.1f} us"
    return text


# ---------------------------------------------------------------------------------------- GPU

def require_gpu() -> None:
    from tritond.repository.devices import gpu_count
    if gpu_count() == 0:
        sys.exit("--gpu: no GPU here (nvidia-smi lists none); the GPU variants need a CUDA GPU")
    try:
        import torch
    except ImportError:
        sys.exit("--gpu: torch is not installed")
    if not torch.cuda.is_available():
        sys.exit(f"--gpu: torch {torch.__version__} cannot use the GPU (CPU-only build or driver mismatch)")


def gpu_model(path: Path) -> None:
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, GPU_WIDTH), torch.nn.ReLU()]
    for _ in range(GPU_LAYERS):
        layers += [torch.nn.Linear(GPU_WIDTH, GPU_WIDTH), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(GPU_WIDTH, WIDTH))
    module = torch.nn.Sequential(*layers).eval()
    torch.jit.save(torch.jit.trace(module, torch.zeros(1, WIDTH)), str(path))


def gpu_instances_bench(args, tmp: Path) -> str:
    model = tmp / "heavy.pt"
    gpu_model(model)
    results = []
    for label, count, extra in (("1 instance", 1, []), ("2 instances", 2, []), ("2 instances + MPS", 2, ["--mps"])):
        repository = tmp / f"gpu-{count}-{len(extra)}"
        (repository / "heavy" / "1").mkdir(parents=True)
        (repository / "heavy" / "config.pbtxt").write_text(GPU_CONFIG.format(name="heavy", width=WIDTH, count=count))
        shutil.copy(model, repository / "heavy" / "1" / "model.pt")
        server = server_with(repository, tmp, extra)
        try:
            server.wait_ready(bench_core.READY_TIMEOUT_S)
            ((_, r),) = measure(server.http, "heavy", (1, WIDTH), [args.gpu_concurrency], args)
        except bench_core.ServerStartError as e:
            results.append((label, None, str(e).splitlines()[0]))
            continue
        finally:
            server.stop()
        results.append((label, r, ""))
    base = results[0][1]
    lines = [f"| GPU MLP {GPU_LAYERS}x{GPU_WIDTH}, c={args.gpu_concurrency} | infer/s | p50 ms | p99 ms | x 1 instance |",
             "|---|---:|---:|---:|---:|"]
    for label, r, error in results:
        if r is None:
            lines.append(f"| {label} | failed: {error} | | | |")
        else:
            ratio = f"{r.infer_per_s / base.infer_per_s:.2f}" if base else "-"
            lines.append(f"| {label} | {r.infer_per_s:,.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {ratio} |")
    return "\n".join(lines)


HANDOFF = textwrap.dedent("""
    import sys, time
    import numpy as np, torch
    from multiprocessing import shared_memory
    from tritond.workers import cuda_ipc

    role, mode, nbytes, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    n = nbytes // 4
    dev = torch.device("cuda", 0)
    shm = shared_memory.SharedMemory(name=sys.argv[5], create=False)
    host = np.ndarray((n,), dtype=np.float32, buffer=shm.buf)
    if role == "producer":
        x = torch.arange(n, dtype=torch.float32, device=dev)
        for _ in range(rounds):
            y = x * 2
            torch.cuda.synchronize()
            if mode == "ipc":
                ref = cuda_ipc.export(cuda_ipc.DeviceArray.from_torch(y))
                sys.stdout.write(ref.handle.hex() + " " + str(ref.offset) + "\\n")
            else:
                host[:] = y.cpu().numpy()
                sys.stdout.write("shm\\n")
            sys.stdout.flush()
            sys.stdin.readline()          # the consumer is done: the lease is released
    else:
        imports = cuda_ipc.Imports()
        times = []
        for _ in range(rounds):
            line = sys.stdin.readline().split()
            t0 = time.perf_counter()
            if mode == "ipc":
                ref = cuda_ipc.IpcRef(bytes.fromhex(line[0]), int(line[1]), nbytes, 0)
                z = torch.as_tensor(imports.open(ref, (n,), np.float32), device=dev) + 1
            else:
                z = torch.from_numpy(host).to(dev) + 1
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            imports.close()
            sys.stdout.write("done\\n")
            sys.stdout.flush()
        sys.stderr.write(repr(float(np.median(times)) * 1e6) + "\\n")
    shm.close()
""")


def handoff(mode: str, rounds: int) -> float:
    """Median consumer-side microseconds to get the producer's tensor onto its own device."""
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=HANDOFF_BYTES)
    try:
        argv = [str(HANDOFF_BYTES), str(rounds), shm.name]
        producer = subprocess.Popen([sys.executable, "-c", HANDOFF, "producer", mode, *argv],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        consumer = subprocess.Popen([sys.executable, "-c", HANDOFF, "consumer", mode, *argv],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(rounds):
            consumer.stdin.write(producer.stdout.readline())
            consumer.stdin.flush()
            producer.stdin.write(consumer.stdout.readline())
            producer.stdin.flush()
        _, err = consumer.communicate(timeout=300)
        producer.communicate(timeout=60)
        return float(err.strip().splitlines()[-1])
    finally:
        shm.close()
        shm.unlink()


def gpu_handoff_bench(rounds: int) -> str:
    ipc, host = handoff("ipc", rounds), handoff("shm", rounds)
    mib = HANDOFF_BYTES >> 20
    return (f"| hand-off of a {mib} MiB device tensor to another process | median us | x host shm |\n"
            f"|---|---:|---:|\n"
            f"| CUDA IPC handle (cudaIpcOpenMemHandle) | {ipc:,.1f} | {ipc / host:.2f} |\n"
            f"| host shared memory (D2H, shm, H2D) | {host:,.1f} | 1.00 |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="run the GPU variants instead of the CPU comparison")
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8])
    p.add_argument("--gpu-concurrency", type=int, default=8)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per point")
    p.add_argument("--threads", type=int, default=1, help="in-process torch threads (the worker default is 1)")
    p.add_argument("--rounds", type=int, default=50, help="hand-offs measured per GPU variant")
    args = p.parse_args()
    if args.gpu:
        require_gpu()
    with tempfile.TemporaryDirectory(prefix="bench_pytorch_") as tmp:
        try:
            if args.gpu:
                report = gpu_instances_bench(args, Path(tmp)) + "\n\n" + gpu_handoff_bench(args.rounds)
            else:
                report = cpu_bench(args, Path(tmp))
        except (bench_core.ServerStartError, loadgen.LoadgenError) as exc:
            sys.exit(str(exc))
    print(report)


if __name__ == "__main__":
    main()
