"""Implicit state (`sequence_batching { state [...] }`) of the sequences this worker runs.

Each state tensor of a sequence lives in a block of this worker's shared-memory arena (the
process that allocates a block frees it): START sets it to zeros or the config's
`initial_state`; before each request the model gets it as the state input; after it the
model's state output replaces it (kept as it was when the model does not return one); END,
or the broker's EndSequences (idle, cancelled), frees it. Clients see a state output only as
Triton shows it: when the config also declares it as a model output and the request asks for
it (by name, or by naming no outputs).
A padding request of a direct batch gets zeros shaped like its batch's first real request's
state, and its state output is dropped. A BYTES (TYPE_STRING) state is held as the object array
it is, in this process: its zeros are empty strings, its initial_state file Triton's serialized
BYTES.
"""
from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from tritond.repository.datatypes import CONFIG_TO_WIRE, WIRE_TO_NUMPY, deserialize_bytes
from tritond.shm.arena import Arena, Block
from tritond.wire.schema import ModelView

from .backends.base import WorkerRequest, WorkerResponse

FLAG_START = 1
FLAG_END = 2
INITIAL_STATE_FOLDER = "initial_state"


@dataclass
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype
    shape: list[int]                # with the batch dimension for a batching model
    initial: bytes | np.ndarray | None = None    # initial_state data (None: zeros); BYTES: its array

    def zeros(self, shape: list[int]) -> np.ndarray:
        if self.dtype == np.object_:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, self.dtype)


def state_specs(view: ModelView, config: dict, model_dir: str) -> list[StateSpec]:
    """The config's states (`config` gives their types, dims and initial data, which the view
    does not carry)."""
    seq = config.get("sequence_batching") or {}
    batched = view.max_batch_size > 0
    out = []
    for s in seq.get("state") or []:
        dtype = np.dtype(WIRE_TO_NUMPY[CONFIG_TO_WIRE[s["data_type"]]])
        dims = [int(d) for d in s.get("dims") or []]
        shape = ([1] if batched else []) + [1 if d == -1 else d for d in dims]
        initial: bytes | np.ndarray | None = None
        for init in (s.get("initial_state") or [])[:1]:
            shape = ([1] if batched else []) + [int(d) for d in init.get("dims") or []]
            count = int(np.prod(shape, dtype=np.int64))
            if not init.get("data_file"):
                initial = None if dtype == np.object_ else bytes(dtype.itemsize * count)
                continue
            with open(os.path.join(model_dir, INITIAL_STATE_FOLDER, init["data_file"]), "rb") as f:
                if dtype == np.object_:
                    initial = deserialize_bytes(f.read(), count).reshape(shape)
                else:
                    initial = f.read(dtype.itemsize * count)
        out.append(StateSpec(s["input_name"], s["output_name"], dtype, shape, initial))
    return out


class SequenceStates:
    def __init__(self, specs: list[StateSpec], arena: Arena, config_outputs: list[str]) -> None:
        self.specs = specs
        self.arena = arena
        self.config_outputs = config_outputs
        self.held: dict[int, dict[str, tuple[Block | None, np.ndarray]]] = {}     # block None: BYTES

    def __bool__(self) -> bool:
        return bool(self.specs)

    def _store(self, seq: int, spec: StateSpec, data: np.ndarray | bytes, shape: list[int]) -> np.ndarray:
        """Put `data` in the sequence's block for `spec` (a new one when the size changed); a
        BYTES state is kept as its own array."""
        states = self.held.setdefault(seq, {})
        if spec.dtype == np.object_:
            value = np.array(data, dtype=object).reshape(shape)
            states[spec.input_name] = (None, value)
            return value
        raw = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        current = states.get(spec.input_name)
        if current is not None and current[0].nbytes != raw.nbytes:
            self.arena.free(current[0].seg, current[0].offset)
            current = None
        block = current[0] if current is not None else self.arena.alloc(raw.nbytes)
        view = np.frombuffer(block.view, dtype=spec.dtype, count=raw.nbytes // spec.dtype.itemsize).reshape(shape)
        if raw.nbytes and np.frombuffer(raw, np.uint8).ctypes.data != view.ctypes.data:
            block.view[:raw.nbytes] = raw
        states[spec.input_name] = (block, view)
        return view

    def feed(self, req: WorkerRequest, seq: int, flags: int, pad: bool, like: WorkerRequest | None) -> None:
        """Give the model the state inputs and ask it for the state outputs."""
        for spec in self.specs:
            if pad:
                shape = list(like.inputs[spec.input_name].shape) if like is not None else spec.shape
                req.inputs[spec.input_name] = spec.zeros(shape)
                continue
            held = self.held.get(seq, {}).get(spec.input_name)
            if held is None or flags & FLAG_START:
                data = spec.initial if spec.initial is not None else spec.zeros(spec.shape)
                req.inputs[spec.input_name] = self._store(seq, spec, data, spec.shape)
            else:
                req.inputs[spec.input_name] = held[1]
        wanted = req.requested_outputs or list(self.config_outputs)
        req.requested_outputs = wanted + [s.output_name for s in self.specs if s.output_name not in wanted]

    def keep(self, req: WorkerRequest, response: WorkerResponse, seq: int, flags: int, pad: bool,
             requested: Collection[str] = ()) -> None:
        """Keep the state outputs, and take out of the response those the client does not get
        (`requested`: the outputs it named, none meaning all); at END the state is freed."""
        for spec in self.specs:
            shown = spec.output_name in self.config_outputs and (not requested or spec.output_name in requested)
            value = response.outputs.get(spec.output_name) if shown else response.outputs.pop(spec.output_name, None)
            if value is not None and not pad and response.error is None and not flags & FLAG_END:
                arr = np.asarray(value)
                if arr.dtype != spec.dtype:
                    arr = arr.astype(spec.dtype)
                self._store(seq, spec, arr, list(arr.shape))
        if flags & FLAG_END and not pad:
            self.end([seq])

    def end(self, seqs: list[int]) -> None:
        for seq in seqs:
            for block, _ in (self.held.pop(seq, None) or {}).values():
                if block is not None:
                    self.arena.free(block.seg, block.offset)
