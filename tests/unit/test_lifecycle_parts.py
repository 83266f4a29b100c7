"""The pure parts of the model lifecycle: override names and their directory, file
fingerprints, poll-mode decisions, warmup samples, rate-limit flags, and the operation
runner's locks and load slots."""
from __future__ import annotations

import os
import struct

import pytest

from tritond.broker.lifecycle.jobs import InlineJobs
from tritond.broker.lifecycle.runner import FreeSlot, Lock, OpRunner, Slot, Until
from tritond.broker.scheduling.rate_limiter import ANY_DEVICE, parse_resources
from tritond.options import UsageError, server_options, start_parser
from tritond.wire.options import ServerOptions
from tritond.repository.fingerprint import fingerprint
from tritond.repository.overrides import is_override_dir, override_parts, write_overrides
from tritond.repository.poll import ADD, MODIFY, REMOVE, PollState
from tritond.repository.warmup import WarmupError, warmup_samples
from tritond.wire.errors import Code, TritonError

# ---------------------------------------------------------------------- overrides


@pytest.mark.parametrize("key", ["file:../x", "file:1/../../x", "file:/../etc/passwd", "file:1\\..\\x",
                                 "file:a/../../b"])
def test_override_names_that_leave_the_directory_are_refused(key):
    with pytest.raises(TritonError, match="must stay within model directory") as e:
        override_parts(key)
    assert e.value.code is Code.INVALID_ARG


def test_override_names_with_nul_or_nothing_are_refused():
    with pytest.raises(TritonError, match="must not contain NUL"):
        override_parts("file:1/a\0b")
    with pytest.raises(TritonError, match="names no file"):
        override_parts("file:./")
    assert override_parts("file:1/./sub//model.py") == ["1", "sub", "model.py"]
    assert override_parts("file:/1/model.py") == ["1", "model.py"], "a leading / names the model directory"


def test_overrides_are_written_privately_and_never_through_a_link(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = write_overrides(str(run_dir), "m", {"file:1/model.py": b"code", "file:labels.txt": b"a\nb"})
    assert open(os.path.join(path, "1", "model.py"), "rb").read() == b"code"
    assert is_override_dir(str(run_dir), path, "m") and not is_override_dir(str(run_dir), path, "other")
    assert oct(os.stat(os.path.dirname(path)).st_mode)[-3:] == "700"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(path, "link"))
    from tritond.repository import overrides
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(TritonError, match="must stay within model directory"):
            overrides._write(top, "file:link/x", b"pwned")
    finally:
        os.close(top)
    assert list(outside.iterdir()) == []
    with pytest.raises(TritonError, match="more than the 4 bytes allowed"):
        write_overrides(str(run_dir), "m", {"file:1/model.py": b"12345"}, limit=4)
    with pytest.raises(TritonError, match="directory has been created as a file"):
        write_overrides(str(run_dir), "m", {"file:1/a": b"", "file:1/a/b": b""})
    assert len(os.listdir(run_dir / "overrides")) == 1          # failed writes leave nothing


# ---------------------------------------------------------------------- fingerprints and polling


def test_fingerprints_tell_which_part_of_a_model_changed(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("a")
    (tmp_path / "m" / "1" / "model.py").write_text("x")
    first = fingerprint(str(tmp_path / "m"))
    assert first == fingerprint(str(tmp_path / "m")) and sorted(first.versions) == [1, 2]
    (tmp_path / "m" / "2" / "model.py").write_text("y")
    second = fingerprint(str(tmp_path / "m"))
    assert second.shared == first.shared and second.changed_versions(first) == {2}
    (tmp_path / "m" / "config.pbtxt").write_text("b")
    third = fingerprint(str(tmp_path / "m"))
    assert third.config != second.config and third.shared == second.shared and third != second
    (tmp_path / "m" / "labels.txt").write_text("cat")
    assert fingerprint(str(tmp_path / "m")).shared != third.shared
    assert fingerprint(str(tmp_path / "gone")) is None


def test_a_change_is_acted_on_once_two_scans_agree():
    poll = PollState()
    a1, a2, b1, b2 = object(), object(), object(), object()

    def kinds(changes):
        return [(c.name, c.kind) for c in changes]

    poll.baseline({"a": a1})
    assert poll.observe({"a": a2}) == [] and poll.pending        # seen once: maybe mid-copy
    assert poll.observe({"a": a1}) == [] and not poll.pending    # changed back: nothing to do
    assert poll.observe({"a": a2, "b": b1}) == []
    assert kinds(poll.observe({"a": a2, "b": b2})) == [("a", MODIFY)]   # b is still changing
    assert kinds(poll.observe({"a": a2, "b": b2})) == [("b", ADD)]
    assert poll.observe({"b": b2}, busy=frozenset({"a"})) == []  # an operation on a still runs
    assert poll.observe({"b": b2}) == []
    assert kinds(poll.observe({"b": b2})) == [("a", REMOVE)]


# ---------------------------------------------------------------------- warmup samples


def config(*samples: dict, max_batch: int = 4) -> dict:
    return {"max_batch_size": max_batch, "input": [{"name": "X"}], "model_warmup": list(samples)}


def test_warmup_samples_follow_tritons_rules(tmp_path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(struct.pack("<3f", 1, 2, 3))
    (tmp_path / "warmup" / "s.bin").write_bytes(struct.pack("<I", 2) + b"hi")
    samples = warmup_samples(config(
        {"name": "skipped", "batch_size": 0},
        {"name": "z", "batch_size": 2, "count": 3, "inputs": {"X": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}}},
        {"name": "f", "batch_size": 1, "inputs": {"X": {"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "x.bin"},
                                                  "S": {"data_type": "TYPE_STRING", "dims": [1], "input_data_file": "s.bin"}}},
        {"name": "r", "batch_size": 1, "inputs": {"X": {"data_type": "TYPE_STRING", "dims": [2], "random_data": True}}},
    ), str(tmp_path))
    assert [(s.name, s.batch_size, s.count) for s in samples] == [("z", 2, 3), ("f", 1, 1), ("r", 1, 1)]
    dtype, x = samples[0].inputs["X"]
    assert dtype == "FP32" and x.shape == (1, 3) and not x.any()
    assert samples[1].inputs["X"][1].tolist() == [[1.0, 2.0, 3.0]]
    assert samples[1].inputs["S"][1].tolist() == [[b"hi"]]    # not a model input (a control): batched too
    assert samples[2].inputs["X"][1].tolist() == [[b"", b""]]             # random strings are empty, as in Triton


@pytest.mark.parametrize("spec, message", [
    ({"data_type": "TYPE_FP32", "dims": [-1], "zero_data": True}, "variable-size dimensions"),
    ({"data_type": "TYPE_FP32", "dims": [2]}, "sets no data"),
    ({"data_type": "TYPE_FP32", "dims": [2], "input_data_file": "../secret"}, "inside the model's 'warmup'"),
    ({"data_type": "TYPE_FP32", "dims": [2], "input_data_file": "missing.bin"}, "cannot read"),
])
def test_bad_warmup_samples_are_refused_naming_the_sample(tmp_path, spec, message):
    with pytest.raises(WarmupError, match=f"warmup sample 'w'.*{message}"):
        warmup_samples(config({"name": "w", "batch_size": 1, "inputs": {"X": spec}}), str(tmp_path))


# ---------------------------------------------------------------------- flags


def options(*argv: str) -> ServerOptions:
    return server_options(start_parser().parse_args(["--model-repository", "/r", *argv]))


def test_lifecycle_flags():
    o = options("--rate-limit=execution_count", "--rate-limit-resource=R:2", "--rate-limit-resource=G:1:0",
                "--model-load-thread-count=2", "--repository-poll-secs=0")
    assert (o.rate_limit, o.model_load_thread_count, o.repository_poll_secs) == ("execution_count", 2, 0)
    assert parse_resources(o.rate_limit_resources) == {("R", ANY_DEVICE): 2, ("G", 0): 1}
    for bad in (["--rate-limit-resource=R"], ["--model-load-thread-count=0"], ["--repository-poll-secs=-1"],
                ["--model-unload-timeout-secs=0"], ["--model-file-override-max-bytes=0"]):
        with pytest.raises(UsageError):
            options(*bad)


# ---------------------------------------------------------------------- the operation runner


def test_operations_on_related_models_wait_and_loads_share_the_slots():
    runner = OpRunner(InlineJobs(), slots=2)
    log: list[str] = []
    gates = {n: False for n in "abcd"}

    def op(name: str, models: str):
        yield Lock(frozenset(models))
        yield Slot()
        log.append(f"start {name}")
        yield Until(lambda: gates[name])
        yield FreeSlot()
        log.append(f"end {name}")
        return name

    answers: dict[str, object] = {}
    for name, models in (("a", "x"), ("b", "xy"), ("c", "z"), ("d", "w")):
        runner.start(op(name, models), lambda r=None, error=None, n=name: answers.__setitem__(n, r))
    assert log == ["start a", "start c"]          # b waits for x; d for a load slot
    gates["a"] = True
    runner.tick()
    assert log[2:] == ["start d", "end a"]        # a's slot went to d; b holds x now, and waits for a slot
    gates["c"] = True
    runner.tick()
    assert log[4:] == ["start b", "end c"]
    gates.update(b=True, d=True)
    runner.tick()
    assert set(answers) == {"a", "b", "c", "d"} and runner.idle()
