"""Model repositories of the one fault model (tests/fixtures/fault_model.py) that the fault,
shutdown and chaos scenarios configure differently."""
from __future__ import annotations

import shutil
from pathlib import Path

MODEL_SOURCE = Path(__file__).resolve().parent / "fixtures" / "fault_model.py"


def started(markers: Path) -> int:
    """How many requests fault models with this marker_dir have begun to execute."""
    path = markers / "started"
    return sum(int(n) for n in path.read_text().split()) if path.exists() else 0


def add_fault_model(repo: Path, name: str, *, count: int = 1, max_batch: int = 4, dims: str = "-1",
                    batching: str | None = "", params: dict[str, object] | None = None,
                    pid_outputs: bool = False, tag_output: bool = False, random_output: bool = False,
                    group: str = "", extra: str = "", versions: tuple[int, ...] = (1,)) -> None:
    """One model directory: `batching` is the body of `dynamic_batching { }` (None: no dynamic
    batching), `params` its config parameters, `pid_outputs` adds the PID and BATCH_SIZE outputs,
    `tag_output` the TAG output, `random_output` a RANDOM one; `group` goes inside its instance
    group, `extra` at the end of its config (model_warmup, version_policy); `versions` are its
    version directories."""
    for v in versions:
        (repo / name / str(v)).mkdir(parents=True)
        shutil.copyfile(MODEL_SOURCE, repo / name / str(v) / "model.py")
    outputs = [f'{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}']
    if pid_outputs:
        outputs += ['{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }',
                    '{ name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] }']
    if tag_output:
        outputs.append('{ name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] }')
    if random_output:
        outputs.append('{ name: "RANDOM" data_type: TYPE_FP64 dims: [ 1 ] }')
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        f"max_batch_size: {max_batch}",
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]',
        "output [ " + ", ".join(outputs) + " ]",
        f"instance_group [ {{ count: {count} kind: KIND_CPU {group} }} ]",
    ]
    if batching is not None:
        lines.append(f"dynamic_batching {{ {batching} }}")
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in (params or {}).items()]
    lines.append(extra)
    (repo / name / "config.pbtxt").write_text("\n".join(lines) + "\n")
