"""Ensembles over a repository of small Python models built here: a DAG whose parallel branch
runs concurrently, nested ensembles, every load-time validation error, failing, crashing,
full and timed-out steps (every request ends, none hangs), pruning to the requested outputs,
and explicit model control (loading an ensemble loads what it composes)."""
from __future__ import annotations

import concurrent.futures as futures
import os
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, serving, wait_for

MODEL = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

NAME = {name!r}


def hold(params):
    """A parameter gate_<model> names a directory: say "started", then wait for "open"."""
    gate = params.get("gate_" + NAME)
    if gate:
        open(os.path.join(gate, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(gate, "open")) and time.monotonic() < deadline:
            time.sleep(0.01)


class TritonPythonModel:
{extra}
    def execute(self, requests):
        params = [json.loads(r.parameters() or "{{}}") for r in requests]
        for p in params:
            hold(p)
        out = []
        for r, p in zip(requests, params):
            if p.get("fail") == NAME:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(NAME + " was asked to fail")))
                continue
            start = time.time_ns()
            time.sleep(float(p.get("sleep_ms", 0)) / 1000)
            x = {{t.name(): t.as_numpy() for t in r.inputs()}}
            stamp = np.array([start, time.time_ns()], dtype=np.int64)
            y = {body}
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, np.asarray(v)) for k, v in y.items()]))
        return out
'''


def io(kind: str, name: str, dtype: str = "TYPE_FP32", dims: str = "-1") -> str:
    return f'{kind} {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}'


PYTHON_MODELS = {
    # name: (inputs, outputs, body, extra config)
    "split": (["IN"], ["A", "B"], '{"A": x["IN"] + 1, "B": x["IN"] * 2}', ""),
    "left": (["A"], ["L", ("LT", "TYPE_INT64", "2")], '{"L": x["A"] * 10, "LT": stamp}', ""),
    "right": (["B"], ["R", ("RT", "TYPE_INT64", "2")], '{"R": x["B"] - 1, "RT": stamp}', ""),
    "join": (["L", "R"], ["SUM"], '{"SUM": x["L"] + x["R"]}', ""),
    "slow": (["IN"], ["OUT"], '{"OUT": x["IN"]}',
             "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 "
             "allow_timeout_override: true default_timeout_microseconds: 100000000 } }"),
    "broken_init": (["IN"], ["OUT"], '{"OUT": x["IN"]}', ""),
    "late_types": ([], [], '{"OUT": x["IN"]}', ""),
    "optional_pass": ([], ["A_OUT", "B_OUT"], '{k + "_OUT": v for k, v in x.items()}',
                      'input { name: "A" data_type: TYPE_FP32 dims: [ -1 ] optional: true }\n'
                      'input { name: "B" data_type: TYPE_FP32 dims: [ -1 ] optional: true }\nmax_batch_size: 0'),
}

EXTRA = {
    "broken_init": "    def initialize(self, args):\n        raise RuntimeError('broken_init cannot start')\n",
    "late_types": textwrap.indent(textwrap.dedent('''
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]})
            config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]})
            return config
        '''), "    "),
}


def step(model: str, inputs: dict, outputs: dict) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def ensemble(name: str, inputs: list[str], outputs: list[str], steps: list[str], mbs: int = 0) -> str:
    return "\n".join([f'name: "{name}"', 'platform: "ensemble"', f"max_batch_size: {mbs}", *inputs, *outputs,
                      "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }"])


DIAMOND = [step("split", {"IN": "IN"}, {"A": "a", "B": "b"}), step("left", {"A": "a"}, {"L": "l", "LT": "LT"}),
           step("right", {"B": "b"}, {"R": "r", "RT": "RT"}), step("join", {"L": "l", "R": "r"}, {"SUM": "SUM"})]
FP32_IN = io("input", "IN")

ENSEMBLES = {
    "diamond": ensemble("diamond", [FP32_IN],
                        [io("output", "SUM"), io("output", "LT", "TYPE_INT64", "2"), io("output", "RT", "TYPE_INT64", "2")],
                        DIAMOND),
    "nested": ensemble("nested", [FP32_IN], [io("output", "OUT")],
                       [step("diamond", {"IN": "IN"}, {"SUM": "s"}), step("split", {"IN": "s"}, {"A": "OUT"})]),
    "through_slow": ensemble("through_slow", [FP32_IN], [io("output", "OUT")],
                             [step("slow", {"IN": "IN"}, {"OUT": "OUT"})], mbs=1),
    "split_only": ensemble("split_only", [FP32_IN], [io("output", "A")], [step("split", {"IN": "IN"}, {"A": "A"})]),
    "optional_chain": ensemble(
        "optional_chain",
        ['input { name: "A" data_type: TYPE_FP32 dims: [ -1 ] optional: true }',
         'input { name: "B" data_type: TYPE_FP32 dims: [ -1 ] optional: true }'],
        [io("output", "A_END"), io("output", "B_END")],
        [step("optional_pass", {"A": "A", "B": "B"}, {"A_OUT": "a", "B_OUT": "b"}),
         step("optional_pass", {"A": "a", "B": "b"}, {"A_OUT": "A_END", "B_OUT": "B_END"})]),
    "reshaped": ensemble("reshaped", ['input { name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] '
                                      'reshape: { shape: [ 4 ] } }'],
                         [io("output", "OUT"),
                          'output { name: "B" data_type: TYPE_FP32 dims: [ 1, 4 ] reshape: { shape: [ 4 ] } }'],
                         [step("split", {"IN": "IN"}, {"A": "OUT", "B": "B"})]),
    "bad_cycle": ensemble("bad_cycle", [FP32_IN], [io("output", "OUT")], [
        step("split", {"IN": "IN"}, {"A": "t0"}), step("left", {"A": "t2"}, {"L": "t1"}),
        step("left", {"A": "t1"}, {"L": "t2"}), step("right", {"B": "t1"}, {"R": "OUT"})]),
    "bad_unproduced": ensemble("bad_unproduced", [FP32_IN], [io("output", "OUT")], [
        step("split", {"IN": "IN"}, {"A": "a"}), step("left", {"A": "nowhere"}, {"L": "OUT"})]),
    "bad_unknown": ensemble("bad_unknown", [FP32_IN], [io("output", "OUT")], [
        step("split", {"IN": "IN"}, {"A": "a"}), step("no_such_model", {"X": "a"}, {"Y": "OUT"})]),
    "bad_broken_config": ensemble("bad_broken_config", [FP32_IN], [io("output", "OUT")], [
        step("broken_config", {"IN": "IN"}, {"OUT": "OUT"})]),
    "bad_broken_init": ensemble("bad_broken_init", [FP32_IN], [io("output", "OUT")], [
        step("broken_init", {"IN": "IN"}, {"OUT": "OUT"})]),
    "bad_dtype": ensemble("bad_dtype", [io("input", "IN", "TYPE_INT32")], [io("output", "OUT")], [
        step("split", {"IN": "IN"}, {"A": "OUT"})]),
    "bad_shape": ensemble("bad_shape", [io("input", "IN", dims="2, 2")], [io("output", "OUT")], [
        step("split", {"IN": "IN"}, {"A": "OUT"})]),
    "bad_output": ensemble("bad_output", [FP32_IN], [io("output", "OUT"), io("output", "NEVER")], [
        step("split", {"IN": "IN"}, {"A": "OUT"})]),
    "bad_batch": ensemble("bad_batch", [FP32_IN], [io("output", "OUT")], [
        step("slow", {"IN": "IN"}, {"OUT": "OUT"})], mbs=8),
    "bad_late_types": ensemble("bad_late_types", [FP32_IN], [io("output", "OUT")], [
        step("late_types", {"IN": "IN"}, {"OUT": "OUT"})]),
}

# ensemble -> what its UNAVAILABLE reason must say (naming the step, model and tensor)
INVALID = {
    "bad_cycle": ["output 'OUT' for ensemble 'bad_cycle' is not written: at least one of its depending tensors, "
                  "'t2', is not connected"],
    "bad_unproduced": ["output 'OUT' for ensemble 'bad_unproduced' is not written: at least one of its depending "
                       "tensors, 'nowhere', is not connected"],
    "bad_unknown": ["ensemble bad_unknown contains models that are not available or ambiguous: no_such_model"],
    "bad_broken_config": ["ensemble 'bad_broken_config' depends on 'broken_config' which has no loaded version. "
                          "Model 'broken_config' loading failed with error"],
    "bad_broken_init": ["step 0 (model 'broken_init')", "composing model 'broken_init' is not available",
                        "broken_init cannot start"],
    "bad_dtype": ["in ensemble bad_dtype, ensemble tensor IN: inconsistent data type", "TYPE_INT32", "TYPE_FP32",
                  "model split"],
    "bad_shape": ["in ensemble bad_shape, ensemble tensor IN: inconsistent shape", "[2,2]", "[-1]", "model split"],
    "bad_output": ["ensemble output 'NEVER' for ensemble bad_output' is not used"],
    "bad_batch": ["ensemble bad_batch allows maximum batch size 8, but it contains model slow which only "
                  "allows maximum batch size to be 1"],
    "bad_late_types": ["ensemble tensor IN: inconsistent data type", "TYPE_INT32", "model late_types"],
}
COMPOSING = ["split", "left", "right", "join", "slow"]


def build_repository(root: Path) -> Path:
    for name, (inputs, outputs, body, config) in PYTHON_MODELS.items():
        (root / name / "1").mkdir(parents=True)
        tensors = [io("input", i) for i in inputs] + [
            io("output", *(o if isinstance(o, tuple) else (o,))) for o in outputs]
        (root / name / "config.pbtxt").write_text("\n".join(
            [f'name: "{name}"', 'backend: "python"', *tensors, config or "max_batch_size: 0",
             "instance_group [ { count: 1 kind: KIND_CPU } ]"]))
        (root / name / "1" / "model.py").write_text(MODEL.format(name=name, body=body, extra=EXTRA.get(name, "")))
    (root / "broken_config" / "1").mkdir(parents=True)
    (root / "broken_config" / "config.pbtxt").write_text('name: "broken_config"\nbackend: "python"\nmax_batch_size: [')
    for name, text in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return build_repository(tmp_path_factory.mktemp("ensembles"))


@pytest.fixture(scope="module")
def server(repo):
    with serving(TritondServer(repo, ["--exit-on-error=false", "--strict-readiness=false"], grpc=True)) as s:
        yield s


@pytest.fixture
def client(server):
    return httpclient.InferenceServerClient(server.http_url, network_timeout=120)


def submit(pool: futures.Executor, server, model: str, *args, **kwargs) -> futures.Future:
    """An infer call on a thread of `pool`, with a client of its own (clients are not thread-safe)."""
    def call():
        return httpclient.InferenceServerClient(server.http_url, network_timeout=120).infer(model, *args, **kwargs)
    return pool.submit(call)


def fp32(name: str, array: np.ndarray, mod=httpclient):
    inp = mod.InferInput(name, list(array.shape), "FP32")
    inp.set_data_from_numpy(array)
    return inp


def outputs(*names: str):
    return [httpclient.InferRequestedOutput(n) for n in names]


def executions(client, model: str) -> int:
    return client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["success"]["count"]


def expected_sum(x: np.ndarray) -> np.ndarray:
    return (x + 1) * 10 + (x * 2 - 1)


# ---------------------------------------------------------------------- execution

@pytest.mark.parametrize("size", [8, 200_000])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_diamond_runs_its_parallel_branch_concurrently(server, size, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    client = (mod.InferenceServerClient(server.http_url) if protocol == "http"
              else mod.InferenceServerClient(server.grpc_url))
    x = np.linspace(-1, 1, size, dtype=np.float32)
    result = client.infer("diamond", [fp32("IN", x, mod)], parameters={"sleep_ms": 300})
    np.testing.assert_allclose(result.as_numpy("SUM"), expected_sum(x), rtol=1e-6)
    lt, rt = result.as_numpy("LT"), result.as_numpy("RT")
    assert lt[1] - lt[0] >= 300_000_000 and rt[1] - rt[0] >= 300_000_000    # the parameter reached both
    assert lt[0] < rt[1] and rt[0] < lt[1], "left and right did not overlap"


def test_an_ensemble_response_carries_the_requests_sequence_parameters(server, client):
    """As Triton: a response made of step outputs carries the request's sequence id and flags
    as response parameters (qa/L0_simple_ensemble test_ensemble_sequence_flags)."""
    x = np.ones(4, np.float32)
    assert client.infer("split_only", [fp32("IN", x)]).get_response()["parameters"] == {
        "sequence_id": 0, "sequence_start": False, "sequence_end": False}
    g = grpcclient.InferenceServerClient(server.grpc_url)
    params = g.infer("split_only", [fp32("IN", x, grpcclient)], sequence_id=7, sequence_start=True,
                     sequence_end=False).get_response().parameters
    g.close()
    assert (params["sequence_id"].int64_param, params["sequence_start"].bool_param,
            params["sequence_end"].bool_param) == (7, True, False)


def test_nested_ensemble(client):
    x = np.arange(100_000, dtype=np.float32)
    out = client.infer("nested", [fp32("IN", x)]).as_numpy("OUT")
    np.testing.assert_allclose(out, expected_sum(x) + 1, rtol=1e-6)


@pytest.mark.parametrize("wanted", [("A_END",), ("A_END", "B_END")])
def test_an_output_a_step_does_not_make_is_an_absent_optional_input_downstream(client, wanted):
    """As Triton: a step output the model leaves out is an empty placeholder, so the next step
    runs without that optional input, and an ensemble output never made is left out of the
    answer (qa/L0_optional_input's optional_connecting_tensor)."""
    x = np.arange(3, dtype=np.float32)
    result = client.infer("optional_chain", [fp32("A", x)], outputs=outputs(*wanted))
    assert [o["name"] for o in result.get_response()["outputs"]] == ["A_END"]
    np.testing.assert_array_equal(result.as_numpy("A_END"), x)


def test_an_ensemble_output_never_made_is_logged_at_verbose_level_1(server, client):
    """Triton's verbose line for a requested ensemble output no step made (qa/L0_simple_ensemble
    looks for it)."""
    client.update_log_settings({"log_verbose_level": 1})
    try:
        client.infer("optional_chain", [fp32("A", np.ones(2, np.float32))], outputs=outputs("A_END", "B_END"))
        wait_for(lambda: "Composing models did not output tensor B_END" in server.log, 30,
                 "the verbose line in the server log")
    finally:
        client.update_log_settings({"log_verbose_level": 0})


def test_ensemble_reshapes_apply_to_its_inputs_and_outputs(client):
    """As Triton: an ensemble input's `reshape` is the shape its steps read, and an output's
    `dims` the shape the client reads when it has a `reshape` (qa/L0_infer_reshape)."""
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    result = client.infer("reshaped", [fp32("IN", x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x.reshape(4) + 1)
    np.testing.assert_array_equal(result.as_numpy("B"), x.reshape(1, 4) * 2)


def test_only_the_steps_a_requested_output_needs_run(client):
    before = {m: executions(client, m) for m in ("split", "left", "right", "join")}
    result = client.infer("diamond", [fp32("IN", np.ones(4, np.float32))], outputs=outputs("LT"))
    assert [o["name"] for o in result.get_response()["outputs"]] == ["LT"]
    after = {m: executions(client, m) for m in ("split", "left", "right", "join")}
    assert {m: after[m] - before[m] for m in after} == {"split": 1, "left": 1, "right": 0, "join": 0}


@pytest.mark.parametrize("failing, index", [("split", 0), ("right", 2), ("join", 3)])
def test_a_failing_step_fails_the_request_naming_its_model(client, failing, index):
    with pytest.raises(InferenceServerException) as e:
        client.infer("diamond", [fp32("IN", np.ones(4, np.float32))], parameters={"fail": failing, "sleep_ms": 50})
    assert f"step {index} (model '{failing}') failed: {failing} was asked to fail" in str(e.value)
    assert "in ensemble 'diamond'" in str(e.value)
    ok = client.infer("diamond", [fp32("IN", np.ones(4, np.float32))]).as_numpy("SUM")
    np.testing.assert_allclose(ok, expected_sum(np.ones(4, np.float32)))


def test_a_full_step_queue_ends_every_request(server, client, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    x = np.ones((1, 4), np.float32)
    pool = futures.ThreadPoolExecutor(8)
    held = submit(pool, server, "through_slow", [fp32("IN", x)], parameters={"gate_slow": str(gate)})
    wait_for(lambda: (gate / "started").exists(), what="the gated step to start")
    burst = [submit(pool, server, "through_slow", [fp32("IN", x)]) for _ in range(6)]
    rejected = 0
    for f in futures.as_completed(burst, timeout=60):
        if f.exception() is not None:
            assert "Exceeds maximum queue size" in str(f.exception()) and "model 'slow'" in str(f.exception())
            rejected += 1
        if rejected == 5:
            break
    assert rejected == 5, "one request fits the queue, the other five are refused at once"
    (gate / "open").touch()
    ok = [f for f in burst if f.exception(timeout=60) is None]
    assert len(ok) == 1 and held.result(timeout=60).as_numpy("OUT").shape == (1, 4)
    pool.shutdown()


def test_a_step_timeout_propagates(server, client, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    x = np.ones((1, 4), np.float32)
    with futures.ThreadPoolExecutor(2) as pool:
        held = submit(pool, server, "through_slow", [fp32("IN", x)], parameters={"gate_slow": str(gate)})
        wait_for(lambda: (gate / "started").exists(), what="the gated step to start")
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            client.infer("through_slow", [fp32("IN", x)], timeout=100_000)
        (gate / "open").touch()
        held.result(timeout=60)


def test_a_killed_composing_worker_fails_only_its_requests(server, client, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    x = np.arange(50_000, dtype=np.float32)
    pool = futures.ThreadPoolExecutor(4)
    splits = executions(client, "split")
    victim = submit(pool, server, "diamond", [fp32("IN", x)], parameters={"gate_left": str(gate)})
    wait_for(lambda: (gate / "started").exists(), what="the gated step to start")
    queued = submit(pool, server, "diamond", [fp32("IN", x)])
    wait_for(lambda: executions(client, "split") == splits + 2,   # its 'left' step now waits in the queue
             what="the second request's split step")
    (pid,) = server.worker_pids("left")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(InferenceServerException) as e:
        victim.result(timeout=60)
    assert "step 1 (model 'left') failed" in str(e.value) and "instance" in str(e.value)
    np.testing.assert_allclose(queued.result(timeout=120).as_numpy("SUM"), expected_sum(x), rtol=1e-6)
    wait_for(lambda: client.is_model_ready("diamond"), what="diamond to be ready again")
    again = client.infer("diamond", [fp32("IN", x)]).as_numpy("SUM")
    np.testing.assert_allclose(again, expected_sum(x), rtol=1e-6)
    assert server.worker_pids("left") != [pid]
    pool.shutdown()


# ---------------------------------------------------------------------- validation

def test_invalid_ensembles_are_unavailable_with_their_reason(server, client):
    """Each with its reason in the repository index and, once, in the server log (besides its
    row of the start-up model table)."""
    index = {m["name"]: m for m in client.get_model_repository_index()}
    log = server.log_outside_tables
    for name, fragments in INVALID.items():
        entry = index[name]
        assert entry.get("state") == "UNAVAILABLE", (name, entry)
        for fragment in fragments:
            assert fragment in entry.get("reason", ""), (name, fragment, entry.get("reason"))
        assert log.count(entry["reason"]) == 1, (name, entry["reason"])
    for name in COMPOSING + ["diamond", "nested", "through_slow", "late_types"]:
        assert index[name].get("state") == "READY", (name, index[name])
    assert index["broken_init"].get("state") == "UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'bad_cycle' has no available versions"):
        client.infer("bad_cycle", [fp32("IN", np.ones(2, np.float32))])


# ---------------------------------------------------------------------- explicit model control

@pytest.fixture
def explicit(repo):
    with serving(TritondServer(repo, ["--model-control-mode=explicit", "--load-model=diamond"], grpc=False)) as s:
        yield s


def test_explicit_mode_loads_and_unloads_what_an_ensemble_composes(explicit, tmp_path):
    server = explicit
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)

    def states():
        return {m["name"]: m.get("state") for m in client.get_model_repository_index()}

    loaded = {n: s for n, s in states().items() if s}
    assert loaded == {n: "READY" for n in ("diamond", "split", "left", "right", "join")}
    x = np.ones(4, np.float32)
    np.testing.assert_allclose(client.infer("diamond", [fp32("IN", x)]).as_numpy("SUM"), expected_sum(x))

    # A composing model unloaded under queued ensemble requests: they finish on it, as in Triton.
    gate = tmp_path / "gate"
    gate.mkdir()
    with futures.ThreadPoolExecutor(2) as pool:
        held = submit(pool, server, "diamond", [fp32("IN", x)], parameters={"gate_left": str(gate)})
        wait_for(lambda: (gate / "started").exists(), what="the gated step to start")
        splits = executions(client, "split")
        queued = submit(pool, server, "diamond", [fp32("IN", x)])
        wait_for(lambda: executions(client, "split") == splits + 1, what="the queued request's split step")
        client.unload_model("left")
        (gate / "open").touch()
        np.testing.assert_allclose(held.result(timeout=60).as_numpy("SUM"), expected_sum(x))
        np.testing.assert_allclose(queued.result(timeout=60).as_numpy("SUM"), expected_sum(x))
    assert states()["diamond"] == "UNAVAILABLE" and not client.is_model_ready("diamond")
    # a reload must not race the old worker's exit
    wait_for(lambda: not server.worker_pids("left"), what="the unloaded worker of 'left' to exit")

    client.load_model("diamond")           # reloads 'left' with it
    assert states()["left"] == "READY" and client.is_model_ready("diamond")
    client.unload_model("diamond", unload_dependents=True)
    wait_for(lambda: all(states()[n] == "UNAVAILABLE" for n in ("diamond", "split", "left", "right", "join")),
             what="diamond and its steps to unload")
    wait_for(lambda: not server.worker_pids(), what="every worker to exit")
    client.load_model("nested")            # an ensemble of an ensemble: everything below loads
    assert all(states()[n] == "READY" for n in ("nested", "diamond", "split", "left", "right", "join"))
    np.testing.assert_allclose(client.infer("nested", [fp32("IN", x)]).as_numpy("OUT"), expected_sum(x) + 1)
    with pytest.raises(InferenceServerException, match="composing model 'broken_init' is not available"):
        client.load_model("bad_broken_init")
