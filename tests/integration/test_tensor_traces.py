"""Trace level TENSORS, as Triton writes it (qa/L0_cmdline_trace's ensemble trace with
--trace-level=TENSORS): each traced request's inputs as it is queued (TENSOR_QUEUE_INPUT), an
ensemble's and each of its steps', and the outputs of each response (TENSOR_BACKEND_OUTPUT), the
ensemble's too, with
Triton's value formatting; a client's shared-memory input is read from its region."""
from __future__ import annotations

import json

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from conftest import TritondServer, serving, wait_for

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: 0
input [{{ name: "INPUT0" data_type: {dtype} dims: [-1] }}]
output [{{ name: "OUTPUT0" data_type: {dtype} dims: [-1] }}]
"""

PIPE = """
name: "pipe"
platform: "ensemble"
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "INPUT0" value: "IN" }
    output_map { key: "OUTPUT0" value: "MID" } },
  { model_name: "second" model_version: -1 input_map { key: "INPUT0" value: "MID" }
    output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


def test_traces_hold_the_tensors_of_an_ensemble_and_its_steps(tmp_path):
    repo = tmp_path / "models"
    for name, dtype in (("first", "TYPE_FP32"), ("second", "TYPE_FP32"), ("words", "TYPE_STRING")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(IDENTITY.format(name=name, dtype=dtype))
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE)
    trace_file = tmp_path / "trace.json"
    args = [f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS",
            "--trace-config=level=TENSORS", "--trace-config=rate=1", "--allow-client-shm=true"]
    region = shm.create_shared_memory_region("tensors_in", "/tritond_test_tensors_in", 16)
    try:
        with serving(TritondServer(repo, args)) as s:
            client = httpclient.InferenceServerClient(s.http_url)
            inp = httpclient.InferInput("IN", [3], "FP32")
            inp.set_data_from_numpy(np.array([0.5, 1e6, -2], np.float32))
            client.infer("pipe", [inp], request_id="p")
            words = httpclient.InferInput("INPUT0", [2], "BYTES")
            words.set_data_from_numpy(np.array([b"a", b"bc"], dtype=object))
            client.infer("words", [words], request_id="w")
            shm.set_shared_memory_region(region, [np.array([1, 2, 3, 4], np.float32)])
            client.register_system_shared_memory("tensors_in", "/tritond_test_tensors_in", 16)
            from_region = httpclient.InferInput("INPUT0", [4], "FP32")
            from_region.set_shared_memory("tensors_in", 16)
            client.infer("first", [from_region], request_id="r")
            client.unregister_system_shared_memory("tensors_in")
        wait_for(trace_file.exists, 10, "the trace file")
    finally:
        shm.destroy_shared_memory_region(region)
    records = json.loads(trace_file.read_text())
    ids = {r["model_name"]: r["id"] for r in records if "model_name" in r and r.get("request_id") == "p"}
    tensors = [(r["id"], r["activity"], r["tensor"]) for r in records if "activity" in r]
    floats = {"data": "0.5,1e+06,-2", "shape": "3", "dtype": "FP32"}
    assert (ids["pipe"], "TENSOR_QUEUE_INPUT", {"name": "IN", **floats}) in tensors
    for step in ("first", "second"):
        assert (ids[step], "TENSOR_QUEUE_INPUT", {"name": "INPUT0", **floats}) in tensors
        assert (ids[step], "TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT0", **floats}) in tensors
    assert (ids["pipe"], "TENSOR_BACKEND_OUTPUT", {"name": "OUT", **floats}) in tensors, "an ensemble's response too"
    word_id = next(r["id"] for r in records if r.get("request_id") == "w")
    assert (word_id, "TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": '"a","bc"', "shape": "2", "dtype": "BYTES"}) in tensors
    region_id = next(r["id"] for r in records if r.get("request_id") == "r")
    assert (region_id, "TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": "1,2,3,4", "shape": "4", "dtype": "FP32"}) \
        in tensors
