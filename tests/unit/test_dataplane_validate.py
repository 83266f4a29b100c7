"""Dataplane.validate: Triton's normalization checks, in Triton's order, with its messages."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tritond.frontend.dataplane import Dataplane, InputTensor, OutputRequest, RequestOptions, split_parameters
from tritond.repository.datatypes import serialize_bytes
from tritond.repository.view import model_view
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError


def entry(name: str, config: dict) -> S.ModelEntry:
    return S.ModelEntry(name, 1, S.ModelState.READY, view=model_view(config), config=config)


ADD_SUB = entry("add_sub", {
    "max_batch_size": 8,
    "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
              {"name": "B", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [4]}],
})
STRINGS = entry("strings", {
    "max_batch_size": 0,
    "input": [{"name": "S", "data_type": "TYPE_STRING", "dims": [-1]},
              {"name": "OPT", "data_type": "TYPE_FP32", "dims": [1], "optional": True}],
    "output": [],
})
dp = Dataplane(None, None, None)   # validate touches neither the broker nor shared memory


def fp32(name: str, shape: list[int], count: int | None = None) -> InputTensor:
    n = count if count is not None else int(np.prod(shape))
    return InputTensor(name, "FP32", shape, np.zeros(n, np.float32).tobytes())


def error_of(entry, inputs, outputs=(), request_id="") -> str:
    with pytest.raises(TritonError) as info:
        dp.validate(entry, list(inputs), list(outputs), request_id)
    assert info.value.code is Code.INVALID_ARG
    return info.value.message


def test_valid_requests_pass():
    dp.validate(ADD_SUB, [fp32("A", [2, 4]), fp32("B", [2, 4])], [OutputRequest("SUM")], "")
    dp.validate(STRINGS, [InputTensor("S", "BYTES", [2], serialize_bytes(np.array([b"a", b"bc"], object)))], [], "")


def test_input_count_before_names():
    assert error_of(ADD_SUB, [fp32("X", [1, 4])]) == (
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['X'], "
        "but missing required input(s) ['A','B']. Please provide all required input(s).")
    assert error_of(ADD_SUB, [fp32("A", [1, 4]), fp32("X", [1, 4])]) == \
        "unexpected inference input 'X' for model 'add_sub'"
    assert error_of(STRINGS, [], request_id="r9") == (
        "[request id: r9] expected number of inputs between 1 and 2 but got 0 inputs for model 'strings'. "
        "Got input(s) [], but missing required input(s) ['S']. Please provide all required input(s).")


def test_duplicates_and_outputs():
    assert error_of(ADD_SUB, [fp32("A", [1, 4]), fp32("A", [1, 4])]) == \
        "[request id: <id_unknown>] input 'A' already exists in request"
    both = [fp32("A", [1, 4]), fp32("B", [1, 4])]
    assert error_of(ADD_SUB, both, [OutputRequest("SUM"), OutputRequest("SUM")]) == \
        "[request id: <id_unknown>] output 'SUM' already exists in request"
    assert error_of(ADD_SUB, both, [OutputRequest("NOPE")]) == "unexpected inference output 'NOPE' for model 'add_sub'"


def test_batch_checks_come_before_shape_checks():
    assert error_of(ADD_SUB, [fp32("A", [9, 3]), fp32("B", [9, 4])]) == \
        "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'"
    assert error_of(ADD_SUB, [fp32("A", [2, 4]), fp32("B", [3, 4])]) == \
        "[request id: <id_unknown>] input 'B' batch size does not match other inputs for 'add_sub'"
    assert error_of(ADD_SUB, [fp32("A", []), fp32("B", [1, 4])]) == \
        "[request id: <id_unknown>] input 'A' has no shape but model requires batch dimension for 'add_sub'"


def test_dtype_shape_and_size():
    b = fp32("B", [1, 4])
    wrong_type = InputTensor("A", "INT32", [1, 4], bytes(16))
    assert error_of(ADD_SUB, [wrong_type, b]) == \
        "[request id: <id_unknown>] inference input 'A' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    assert error_of(ADD_SUB, [fp32("A", [1, 5]), b]).startswith(
        "[request id: <id_unknown>] unexpected shape for input 'A' for model 'add_sub'. Expected [-1,4], got [1,5]. "
        "NOTE: Setting a non-zero max_batch_size")
    assert error_of(ADD_SUB, [fp32("A", [1, 4], count=3), b]) == \
        "[request id: <id_unknown>] input byte size mismatch for input 'A' for model 'add_sub'. Expected 16, got 12"
    assert error_of(ADD_SUB, [fp32("A", [1, -1], count=0), b]) == \
        "[request id: <id_unknown>] All input dimensions should be specified for input 'A' for model 'add_sub', " \
        "got [1,-1]"


def test_shape_message_without_batching_ends_with_period_space():
    s = InputTensor("S", "BYTES", [1, 1], serialize_bytes(np.array([b"a"], object)))
    assert error_of(STRINGS, [s]) == \
        "[request id: <id_unknown>] unexpected shape for input 'S' for model 'strings'. Expected [-1], got [1,1]. "


def test_bytes_element_checks():
    def strings(items, shape):
        return InputTensor("S", "BYTES", shape, serialize_bytes(np.array(items, object)))
    assert error_of(STRINGS, [strings([b"a", b"b", b"c"], [2])]) == \
        "[request id: <id_unknown>] unexpected number of string elements 3 for inference input 'S' for model " \
        "'strings', expecting 2"
    assert error_of(STRINGS, [strings([b"a"], [2])]) == \
        "[request id: <id_unknown>] expected 2 string elements for inference input 'S' for model 'strings', got 1"
    truncated = InputTensor("S", "BYTES", [1], (5).to_bytes(4, "little") + b"ab")
    assert "incomplete string for inference input 'S'" in error_of(STRINGS, [truncated])
    short = InputTensor("S", "BYTES", [1], b"\x01\x00")
    assert error_of(STRINGS, [short]) == (
        "[request id: <id_unknown>] incomplete string length indicator for inference input 'S' for model "
        "'strings', expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator "
        "is in one buffer.")


def test_split_parameters():
    opts = split_parameters({"priority": 2, "timeout": 50, "sequence_id": 7, "sequence_start": True,
                             "binary_data_output": True, "custom": "x"})
    assert (opts.priority, opts.timeout_us, opts.correlation_id, opts.flags) == (2, 50, 7, 1)
    assert opts.params == {"custom": "x"}
    with pytest.raises(TritonError):
        split_parameters({"triton_foo": 1})


class FakeArena:
    def __init__(self) -> None:
        self.freed: list[tuple[str, int]] = []

    def alloc(self, n: int):
        from tritond.shm.arena import Block
        return Block("seg", 0, n, memoryview(bytearray(n)))

    def free(self, seg: str, offset: int) -> None:
        self.freed.append((seg, offset))


class HangingClient:
    """Never answers; remembers what to run should the broker answer after the caller gave up."""

    def __init__(self) -> None:
        self.orphan = None
        self.asked = asyncio.Event()

    def next_id(self, model: str = "") -> int:
        return 1

    async def infer(self, msg, on_orphan=None):
        self.asked.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.orphan = on_orphan
            raise


def test_cancelled_infer_keeps_inputs_until_the_broker_answers():
    arena, client = FakeArena(), HangingClient()
    plane = Dataplane(client, arena, None)
    big = entry("big", {
        "max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}], "output": []})
    n = S.INLINE_MAX // 4 + 1   # large enough to go through the arena

    async def run() -> None:
        task = asyncio.create_task(plane.infer(big, [fp32("X", [n])], [], RequestOptions()))
        await asyncio.wait_for(client.asked.wait(), 10)      # the request is with the broker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert arena.freed == []          # a worker may still be reading the input
    client.orphan()                   # the broker's late answer
    assert arena.freed == [("seg", 0)]


def test_of_several_bad_inputs_the_one_triton_names_is_reported():
    """Triton walks a request's inputs in its hash map's order (last to first for a few inputs),
    so its qa tests expect the error to name the last bad input."""
    two = entry("two_strings", {
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_STRING", "dims": [16]}],
        "output": []})
    short = serialize_bytes(np.array([b"1"] * 14, object))
    inputs = [InputTensor("INPUT0", "BYTES", [1, 16], short), InputTensor("INPUT1", "BYTES", [1, 16], short)]
    assert error_of(two, inputs) == ("[request id: <id_unknown>] expected 16 string elements for inference input "
                                     "'INPUT1' for model 'two_strings', got 14")
