"""The host's thread budget: how many threads the pools of each model instance may start.

Every CPU instance is its own worker process, and each worker's BLAS (OpenBLAS, MKL, BLIS),
OpenMP runtime and framework pools (ONNX Runtime, PyTorch, OpenVINO, TensorFlow) would
otherwise start one thread per core: with N instances on C cores, N x C spinning threads
fight over C cores. So the cores this server may use (`usable_cores`: its CPU affinity,
capped by a cgroup CPU quota) are divided among the CPU instances of every loaded model,
at least one thread each (`default_share`), as Ray sizes OMP_NUM_THREADS per actor, after
one core for the broker and one for each frontend process: a request's path keeps those busy,
and a BLAS pool that spins on their cores makes a small model slower, not faster (one
instance on 2 cores: 395-956 infer/s with 1 thread, 91-762 with 2, perf/bench_python_sweep.py).
A model
sets its own count with its backend's Triton parameter (`THREAD_PARAMETERS`); 0 there means
the framework's own default, every usable core.

Pure arithmetic and parsing; the broker decides (broker/lifecycle/threads.py) and the worker
applies (workers/threads.py).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

from tritonclient.grpc import model_config_pb2

from .backends import ONNXRUNTIME, OPENVINO, PYTHON, PYTORCH, TENSORFLOW, runner
from .parameters import config_parameter, parameter_text

# backend -> (its intra-op / thread count parameter, its inter-op parameter or "")
THREAD_PARAMETERS: dict[str, tuple[str, str]] = {
    ONNXRUNTIME: ("intra_op_thread_count", "inter_op_thread_count"),
    PYTORCH: ("INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"),
    PYTHON: ("INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"),      # tritond's: Triton's Python backend has none
    OPENVINO: ("INFERENCE_NUM_THREADS", ""),
    TENSORFLOW: ("TF_NUM_INTRA_THREADS", "TF_NUM_INTER_THREADS"),
}


@dataclass(frozen=True)
class ThreadChoice:
    """What one instance's pools get. `threads` 0: not budgeted (a GPU instance without a
    parameter), the backend keeps its own defaults and no thread variable is set."""
    threads: int
    inter_op_threads: int
    why: str


def usable_cores(affinity: Callable[[], set[int]] | None = None, cgroup_root: str = "/sys/fs/cgroup",
                 proc_cgroup: str = "/proc/self/cgroup") -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (`cpu.max`, what a container's CPU limit sets), at least 1."""
    try:
        cores = len((affinity or (lambda: os.sched_getaffinity(0)))())
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores)


def cgroup_cpu_quota(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The CPUs a cgroup CPU quota allows this process (rounded up; the smallest along its
    cgroup's ancestors): cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
    None when there is none or it cannot be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    quotas: list[int] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            mounts, files = [cgroup_root], ("cpu.max",)
        elif "cpu" in controllers.split(","):
            mounts = [os.path.join(cgroup_root, controllers), os.path.join(cgroup_root, "cpu")]
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for mount in dict.fromkeys(mounts):
            for depth in range(len(parts), -1, -1):
                cpus = _quota(os.path.join(mount, *parts[:depth]), files)
                if cpus is not None:
                    quotas.append(cpus)
    return min(quotas) if quotas else None


def _quota(directory: str, files: tuple[str, ...]) -> int | None:
    try:
        texts = []
        for name in files:
            with open(os.path.join(directory, name)) as f:
                texts.append(f.read().split())
    except OSError:
        return None
    if len(files) == 1:         # v2: "<quota|max> <period>"
        limit, period = (texts[0] + ["", ""])[:2]
    else:                       # v1: quota (-1: none), period
        limit, period = (texts[0] or [""])[0], (texts[1] or [""])[0]
    if not limit.isdigit() or not period.isdigit() or int(period) == 0 or int(limit) == 0:
        return None
    return max(1, math.ceil(int(limit) / int(period)))


def default_share(cores: int, cpu_instances: int) -> int:
    """Each CPU instance's threads when `cpu_instances` share `cores`: at least 1."""
    return max(1, cores // max(1, cpu_instances))


def cpu_instance_count(config: dict) -> int:
    """The KIND_CPU instances one version of a (normalized) config dict starts."""
    return sum(int(g.get("count", 1) or 1) for g in config.get("instance_group") or []
               if str(g.get("kind", "KIND_CPU")) == "KIND_CPU")


def config_cpu_instance_count(cfg: model_config_pb2.ModelConfig) -> int:
    """The same for a normalized ModelConfig message."""
    return sum(g.count for g in cfg.instance_group if g.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU)


def parse_thread_count(key: str, text: str) -> int | None:
    """A thread-count parameter's value: None when absent, an integer >= 0; ValueError with
    the message a load fails with otherwise."""
    text = text.strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"parameter '{key}' must be a non-negative integer (a number of threads; 0: the "
                         f"framework's default, every usable core), got '{text}'")
    return value


def thread_parameters(backend: str) -> tuple[str, str]:
    return THREAD_PARAMETERS.get(backend, ("", ""))


def check_thread_parameters(cfg, fail) -> None:
    """Validation (a ModelConfig message): the backend's thread parameters are counts."""
    for key in thread_parameters(runner(cfg.backend, cfg.runtime)):
        if key:
            try:
                parse_thread_count(key, parameter_text(cfg, key))
            except ValueError as e:
                raise fail(f"parameters.{key}", str(e)) from None


def choose_threads(config: dict, kind: str, cores: int, cpu_instances: int, reserved: int = 0) -> ThreadChoice:
    """One instance's threads: the model's parameter if it sets one, else (a CPU instance) its
    share of `cores`, less the `reserved` ones the broker and the frontends keep busy, among the
    `cpu_instances` CPU instances of the loaded models."""
    intra_key, inter_key = thread_parameters(runner(str(config.get("backend") or ""), str(config.get("runtime") or "")))
    intra = parse_thread_count(intra_key, config_parameter(config, intra_key)) if intra_key else None
    inter = parse_thread_count(inter_key, config_parameter(config, inter_key)) if inter_key else None
    if intra is not None:
        threads = intra or cores
        why = (f"parameter {intra_key}={intra}" if intra else
               f"parameter {intra_key}=0: the framework's default, every one of the {cores} usable cores")
    elif kind == "CPU":
        free = max(1, cores - reserved)
        threads = default_share(free, cpu_instances)
        kept = f", less {reserved} for the broker and the frontends," if reserved else ""
        why = (f"{cores} usable core(s){kept} shared by {cpu_instances} CPU instance(s) of the loaded models"
               + (" (at least 1 each)" if free < cpu_instances else ""))
    else:
        threads, why = 0, f"a {kind} instance is outside the host's CPU budget: the backend's defaults"
    if inter is not None:
        inter_threads = inter or cores
        why += f"; inter-op from parameter {inter_key}={inter}"
    else:
        inter_threads = threads
    return ThreadChoice(threads, inter_threads, why)


# The variables the BLAS, OpenMP and framework runtimes read when they start: set in a
# worker's environment (and for whatever it starts) next to the runtime calls that resize the
# pools already loaded (workers/threads.py).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """The thread variables for a budget of `threads` ({} when not budgeted)."""
    return {key: str(threads) for key in THREAD_VARIABLES} if threads > 0 else {}
