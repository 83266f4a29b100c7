"""The thread budget's pure parts: the share, the parameters that override it, the cores a
process may use (affinity and cgroup quotas), the broker's count of CPU instances, and the
runtime calls that resize a process's pools (in a subprocess, which they change)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tritonclient.grpc import model_config_pb2

from tritond.broker.lifecycle.threads import ThreadBudget, describe
from tritond.broker.supervision.pool import Instance, InstanceState
from tritond.broker.tables.model_version import READY, ModelVersion
from tritond.broker.tables.registry import ModelRegistry
from tritond.repository.spec import ModelSpec
from tritond.repository.threads import (
    ThreadChoice, cgroup_cpu_quota, check_thread_parameters, choose_threads, config_cpu_instance_count,
    cpu_instance_count, default_share, parse_thread_count, thread_env, usable_cores,
)


@pytest.mark.parametrize("cores, instances, share", [
    (2, 1, 2), (2, 2, 1), (2, 3, 1), (2, 4, 1), (16, 3, 5), (16, 4, 4), (1, 0, 1), (8, 0, 8)])
def test_the_share_divides_the_cores_among_the_cpu_instances_at_least_one_each(cores, instances, share):
    assert default_share(cores, instances) == share


def params(backend: str, **values: str) -> dict:
    return {"backend": backend, "parameters": {k: {"string_value": v} for k, v in values.items()}}


def test_a_cpu_instance_without_a_parameter_gets_its_share_and_says_why():
    choice = choose_threads(params("python"), "CPU", cores=8, cpu_instances=4)
    assert (choice.threads, choice.inter_op_threads) == (2, 2)
    assert choice.why == "8 usable core(s) shared by 4 CPU instance(s) of the loaded models"
    assert "at least 1 each" in choose_threads(params("python"), "CPU", 2, 3).why


def test_the_cores_the_broker_and_frontends_keep_busy_are_not_shared():
    choice = choose_threads(params("python"), "CPU", cores=16, cpu_instances=2, reserved=3)
    assert choice.threads == 6
    assert choice.why == ("16 usable core(s), less 3 for the broker and the frontends, shared by 2 CPU "
                          "instance(s) of the loaded models")
    assert choose_threads(params("python"), "CPU", cores=2, cpu_instances=1, reserved=3).threads == 1
    assert choose_threads(params("python", INTRA_OP_THREAD_COUNT="0"), "CPU", 2, 1, reserved=3).threads == 2


@pytest.mark.parametrize("backend, intra, inter", [
    ("onnxruntime", "intra_op_thread_count", "inter_op_thread_count"),
    ("pytorch", "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"),
    ("python", "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT"),
    ("tensorflow", "TF_NUM_INTRA_THREADS", "TF_NUM_INTER_THREADS")])
def test_each_backends_own_parameters_override_the_share(backend, intra, inter):
    choice = choose_threads(params(backend, **{intra: "3", inter: "2"}), "CPU", cores=16, cpu_instances=8)
    assert (choice.threads, choice.inter_op_threads) == (3, 2)
    assert f"parameter {intra}=3" in choice.why and f"parameter {inter}=2" in choice.why
    only_inter = choose_threads(params(backend, **{inter: "5"}), "CPU", cores=16, cpu_instances=8)
    assert (only_inter.threads, only_inter.inter_op_threads) == (2, 5)


def test_openvino_has_one_thread_parameter():
    choice = choose_threads(params("openvino", INFERENCE_NUM_THREADS="6"), "CPU", cores=4, cpu_instances=4)
    assert (choice.threads, choice.inter_op_threads) == (6, 6)


def test_zero_means_the_frameworks_default_every_usable_core():
    choice = choose_threads(params("onnxruntime", intra_op_thread_count="0"), "CPU", cores=12, cpu_instances=6)
    assert choice.threads == 12 and "framework's default" in choice.why


def test_a_gpu_instance_is_outside_the_budget_unless_its_parameter_sets_one():
    assert choose_threads(params("pytorch"), "GPU", cores=8, cpu_instances=2).threads == 0
    assert choose_threads(params("pytorch", INTRA_OP_THREAD_COUNT="2"), "GPU", 8, 2).threads == 2
    assert describe(ThreadChoice(0, 0, "")) == "threads not budgeted"
    assert describe(ThreadChoice(2, 4, "")) == "2 thread(s), 4 inter-op"


@pytest.mark.parametrize("text", ["-1", "four", "1.5", "2 threads"])
def test_a_thread_count_that_is_not_a_non_negative_integer_is_refused(text):
    with pytest.raises(ValueError, match=f"parameter 'K' must be a non-negative integer .*got '{text}'"):
        parse_thread_count("K", text)
    assert parse_thread_count("K", "") is None and parse_thread_count("K", " 4 ") == 4


def config(backend: str, **values: str) -> model_config_pb2.ModelConfig:
    cfg = model_config_pb2.ModelConfig(name="m", backend=backend)
    for k, v in values.items():
        cfg.parameters[k].string_value = v
    return cfg


class Refused(Exception):
    pass


def fail(field: str, message: str) -> Refused:
    return Refused(f"field '{field}': {message}")


@pytest.mark.parametrize("backend, key", [("onnxruntime", "intra_op_thread_count"),
                                          ("onnxruntime", "inter_op_thread_count"),
                                          ("pytorch", "INTER_OP_THREAD_COUNT"),
                                          ("python", "INTRA_OP_THREAD_COUNT")])
def test_validation_names_the_parameter_that_is_not_a_count(backend, key):
    with pytest.raises(Refused, match=f"field 'parameters.{key}': parameter '{key}' must be a non-negative"):
        check_thread_parameters(config(backend, **{key: "-3"}), fail)
    check_thread_parameters(config(backend, **{key: "2"}), fail)
    check_thread_parameters(config("identity", INTRA_OP_THREAD_COUNT="x"), fail)    # not its parameter


def test_usable_cores_are_the_affinity_capped_by_a_cgroup_quota(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert usable_cores(lambda: {0, 1, 2, 3}, str(tmp_path), str(proc)) == 4       # no cpu.max: no quota
    (tmp_path / "a" / "cpu.max").write_text("150000 100000\n")                     # 1.5 CPUs, on an ancestor
    assert cgroup_cpu_quota(str(tmp_path), str(proc)) == 2
    assert usable_cores(lambda: {0, 1, 2, 3}, str(tmp_path), str(proc)) == 2
    (tmp_path / "a" / "b" / "cpu.max").write_text("max 100000\n")
    assert usable_cores(lambda: {0, 1, 2, 3}, str(tmp_path), str(proc)) == 2       # the smallest along the path
    assert usable_cores(lambda: set(), str(tmp_path), str(tmp_path / "none")) == 1


def test_a_cgroup_v1_quota_counts_too(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:cpu,cpuacct:/job\n3:memory:/job\n")
    job = tmp_path / "cpu,cpuacct" / "job"
    job.mkdir(parents=True)
    (job / "cpu.cfs_quota_us").write_text("300000\n")
    (job / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(str(tmp_path), str(proc)) == 3
    (job / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(str(tmp_path), str(proc)) is None


def test_cpu_instances_are_counted_from_config_dicts_and_messages():
    cfg = {"instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 3, "kind": "KIND_GPU"}, {"kind": "KIND_CPU"}]}
    assert cpu_instance_count(cfg) == 3
    msg = model_config_pb2.ModelConfig(name="m")
    msg.instance_group.add(count=2, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    msg.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_GPU)
    assert config_cpu_instance_count(msg) == 2


def test_the_thread_variables():
    assert thread_env(0) == {}
    env = thread_env(3)
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"


def version(name: str, cpu: int, gpu: int = 0, backend: str = "python", **values: str) -> ModelVersion:
    mv = ModelVersion(name, 1, f"/r/{name}", "/r", params(backend, **values))
    mv.instances = [Instance(name, 1, i, f"{name}_0_{i}") for i in range(cpu)]
    mv.instances += [Instance(name, 1, cpu + i, f"{name}_1_{i}", kind="GPU") for i in range(gpu)]
    return mv


def test_the_broker_divides_the_cores_among_every_loaded_and_planned_cpu_instance():
    registry = ModelRegistry()
    budget = ThreadBudget(cores=8)
    spec = ModelSpec("later", "/r/later", model_config_pb2.ModelConfig(name="later"), [1], "")
    spec.config.instance_group.add(count=2, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    budget.plan([spec])                                 # the startup load read 'later' already
    first = version("first", cpu=2, gpu=1)
    budget.assign(registry, [first], [])
    assert [c.threads for c in first.threads.values()] == [2, 2, 0]     # 8 cores, 2 + 2 CPU instances
    registry.replace("first", {1: first})
    first.state = READY
    later = version("later", cpu=2)
    budget.assign(registry, [later], [])
    assert [c.threads for c in later.threads.values()] == [2, 2]
    assert budget.planned == {}
    registry.replace("later", {1: later})
    later.state = READY
    # A reload of 'first' counts its new version, not the one it replaces; a failed instance is gone.
    later.instances[1].move_to(InstanceState.FAILED)
    again = version("first", cpu=1)
    budget.assign(registry, [again], [])
    assert again.threads[0].threads == 4                # 8 cores, 1 + 1 CPU instances
    assert again.threads[0].why == "8 usable core(s) shared by 2 CPU instance(s) of the loaded models"


def test_applying_a_budget_resizes_the_pools_already_loaded_and_sets_the_variables():
    script = ("import json, numpy, os; from tritond.workers.threads import apply_threads, pool_sizes;"
              "applied = apply_threads(1, 1);"
              "print(json.dumps([applied, pool_sizes(), os.environ['OMP_NUM_THREADS']]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={"OPENBLAS_NUM_THREADS": "2", "PATH": "/usr/bin:/bin", **_pythonpath()})
    applied, sizes, omp = json.loads(out.stdout.strip().splitlines()[-1])
    blas = [name for name in sizes if "openblas" in name]
    assert blas and all(sizes[name] == 1 for name in blas) and any("openblas" in a for a in applied)
    assert omp == "1"


def _pythonpath() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "VIRTUAL_ENV", "HOME")}


def test_a_version_restarting_its_instances_still_counts_and_an_unavailable_one_does_not():
    from tritond.broker.tables.model_version import UNAVAILABLE
    registry = ModelRegistry()
    budget = ThreadBudget(cores=6)
    down = version("down", cpu=2)
    down.state, down.restarting = UNAVAILABLE, True
    registry.replace("down", {1: down})
    mv = version("new", cpu=1)
    budget.assign(registry, [mv], [])
    assert mv.threads[0].threads == 2                  # 6 cores, 2 + 1
    down.restarting = False                            # every instance failed: it holds no cores
    again = version("new", cpu=1)
    budget.assign(registry, [again], [])
    assert again.threads[0].threads == 6
