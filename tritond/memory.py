"""`tritond check --memory`: what a repository will cost in memory before it is served.

Measured on this machine rather than guessed: for each backend kind the repository uses, a
probe process imports what that kind's template imports (the framework, once for all its
workers) and then forks a stand-in worker that sets up what every worker sets up (ZeroMQ,
the collector) without a model; its unique memory is the base cost of one more worker. A
model's instances each add that base plus its model files (weights are read into each
worker's private memory). Kinds that are never forked (GPU instances, openvino, tensorflow,
`memory_limit_bytes`, `EXECUTION_ENV_PATH`) pay the whole import in every worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from tritond.broker.supervision.templates import template_kind
from tritond.repository.backends import record_for
from tritond.repository.spec import ModelSpec
from tritond.wire.schema import WorkerSpec

MB = 1 << 20


def _uss(pid: int | str = "self") -> int:
    uss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0]) * 1024
    return uss


def probe(kind: str) -> dict[str, int]:
    """In a fresh process: bytes the kind's import costs, and the base of one forked worker."""
    import gc

    from tritond.workers.template import preload
    before = _uss()
    preload(kind)
    imported = _uss() - before
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        import threading
        import time

        from tritond.workers.main import Worker, heartbeat
        spec = WorkerSpec("probe", f"ipc:///tmp/tritond-memory-probe-{os.getpid()}", "probe", os.getppid(),
                          "probe", 1, "", "", "", {}, "probe")
        worker = Worker(spec)          # the real worker's sockets, mappings and BLS client
        stop = threading.Event()
        threading.Thread(target=heartbeat, args=(worker.ctx, spec, stop, worker.flow), daemon=True).start()
        time.sleep(0.2)
        gc.collect()
        os.write(w, str(_uss()).encode())
        os._exit(0)
    os.close(w)
    worker = int(os.read(r, 64) or b"0")
    os.waitpid(pid, 0)
    return {"import": imported, "worker": worker}


def measure(kinds: set[str]) -> dict[str, dict[str, int]]:
    out = {}
    for kind in sorted(kinds):
        run = subprocess.run([sys.executable, "-m", "tritond.memory", kind], capture_output=True, text=True,
                             timeout=300)
        out[kind] = json.loads(run.stdout) if run.returncode == 0 else {"import": 0, "worker": 0}
    return out


@dataclass
class ModelCost:
    name: str
    kind: str
    instances: int
    forked: bool
    files: int
    bytes: int


def _files_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _kind(config: dict) -> str:
    record = record_for(config.get("backend") or "", config.get("platform") or "", config.get("runtime") or "")
    return record.memory_kind if record else ""


def estimate(specs: list[ModelSpec], measured: dict[str, dict[str, int]]) -> list[ModelCost]:
    from tritond.repository.render import config_to_json
    out = []
    for spec in specs:
        if spec.error or spec.config is None or spec.config.platform == "ensemble":
            continue
        config = config_to_json(spec.config)
        kind = _kind(config)
        files = sum(_files_bytes(os.path.join(spec.path, str(v))) for v in spec.versions)
        per_version = files // max(len(spec.versions), 1)
        total, instances, forked = 0, 0, True
        for group in config.get("instance_group") or [{}]:
            gpu = str(group.get("kind", "KIND_CPU")) == "KIND_GPU"
            count = int(group.get("count", 1)) * (len(group.get("gpus") or [0]) if gpu else 1)
            stand_in = WorkerSpec("", "", "", 0, spec.name, 0, "", "", "", config, "", "GPU" if gpu else "CPU")
            fork = template_kind(stand_in) is not None
            forked = forked and fork
            m = measured.get(kind, {"import": 0, "worker": 0})
            base = m["worker"] if fork else m["import"] + m["worker"]
            total += count * len(spec.versions) * (base + per_version)
            instances += count * len(spec.versions)
        out.append(ModelCost(spec.name, kind, instances, forked, files, total))
    return out


def report(specs: list[ModelSpec]) -> str:
    measured = measure({_kind_of(s) for s in specs} - {""})
    costs = estimate(specs, measured)
    kinds = {c.kind for c in costs if c.forked}
    templates = sum(measured[k]["import"] for k in kinds)
    lines = ["memory estimate (measured here; a forked worker's base is what it alone holds):",
             f"  {'model':<32} {'kind':<12} {'workers':>7} {'files MB':>9} {'MB':>8}"]
    for c in costs:
        lines.append(f"  {c.name:<32} {c.kind + ('' if c.forked else '*'):<12} {c.instances:>7} "
                     f"{c.files / MB:>9.1f} {c.bytes / MB:>8.1f}")
    total = sum(c.bytes for c in costs) + templates
    lines.append(f"  templates (one framework import per kind: {', '.join(sorted(kinds)) or 'none'}): "
                 f"{templates / MB:.1f} MB")
    lines.append(f"  total, workers and templates: {total / MB:.1f} MB "
                 "(* spawned: pays its framework import in every worker)")
    return "\n".join(lines)


def _kind_of(spec: ModelSpec) -> str:
    if spec.error or spec.config is None:
        return ""
    return _kind({"backend": spec.config.backend, "platform": spec.config.platform})


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))
