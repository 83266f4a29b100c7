"""Checks of `sequence_batching` with Triton's messages (core: ValidateModelConfig, the sequence
batcher's Create and GenerateInitialStateData), plus what tritond does not run."""
from __future__ import annotations

import os
from typing import Callable

from tritonclient.grpc import model_config_pb2

from .datatypes import CONFIG_TO_WIRE, ELEMENT_SIZE
from .errors import ConfigError

Fail = Callable[[str, str], ConfigError]
DataType = model_config_pb2.DataType
Kind = model_config_pb2.ModelSequenceBatching.Control.Kind

BOOLEAN_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32,
                DataType.TYPE_STRING)
INITIAL_STATE_FOLDER = "initial_state"
_VALUES = ("int32_false_true", "fp32_false_true", "bool_false_true")
_WHICH = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"


def _controls(cfg: model_config_pb2.ModelConfig, fail: Fail) -> None:
    seq = cfg.sequence_batching
    name = cfg.name
    seen: set[str] = set()
    for i, ci in enumerate(seq.control_input):
        where = f"sequence_batching.control_input[{i}]"
        if not ci.name:
            raise fail(f"{where}.name", f"sequence batching control tensor must have a name for {name}")
        if ci.name in seen:
            raise fail(f"{where}.name", f"sequence batching control tensor '{ci.name}' is specified for multiple "
                                        f"control kinds for {name}")
        seen.add(ci.name)
    for kind_name in (*BOOLEAN_KINDS, "CONTROL_SEQUENCE_CORRID"):
        kind = Kind.Value(kind_name)
        found = [(ci, c) for ci in seq.control_input for c in ci.control if c.kind == kind]
        if len(found) > 1:
            raise fail("sequence_batching.control_input", f"sequence batching specifies multiple {kind_name} "
                                                          f"tensors for {name}")
        if not found:
            continue
        _, c = found[0]
        given = [v for v in _VALUES if len(getattr(c, v))]
        if kind_name == "CONTROL_SEQUENCE_CORRID":
            if given:
                raise fail("sequence_batching.control_input", f"sequence batching must not specify either {_WHICH} "
                                                              f"for {kind_name} for {name}")
            if c.data_type not in CORRID_TYPES:
                raise fail("sequence_batching.control_input",
                           f"unexpected data type for control {kind_name} for {name}. Allowed data types are "
                           f"TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
            continue
        if not given:
            raise fail("sequence_batching.control_input", f"sequence batching must specify either {_WHICH} for "
                                                          f"{kind_name} for {name}")
        if len(given) > 1:
            raise fail("sequence_batching.control_input",
                       f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                       f"'bool_false_true' for {kind_name} for {name}")
        if len(getattr(c, given[0])) != 2:
            raise fail("sequence_batching.control_input", f"sequence batching control '{given[0]}' must have "
                                                          f"exactly 2 entries for {kind_name} for {name}")


def _element_size(datatype: int) -> int:
    """Bytes per element of a config data type (0: STRING or not a type)."""
    return ELEMENT_SIZE.get(CONFIG_TO_WIRE.get(DataType.Name(datatype), ""), 0)


def _states(cfg: model_config_pb2.ModelConfig, fail: Fail, model_path: str) -> None:
    if cfg.sequence_batching.state and cfg.model_transaction_policy.decoupled:
        raise fail("sequence_batching.state", "implicit state is not supported by tritond for decoupled models "
                                              "(their responses are sent while the state would be updated)")
    inputs = {i.name for i in cfg.input}
    names: set[str] = set()
    for i, state in enumerate(cfg.sequence_batching.state):
        where = f"sequence_batching.state[{i}]"
        if not state.input_name or not state.output_name:
            raise fail(where, "a state must name its 'input_name' and 'output_name'")
        if state.input_name in names:
            raise fail(f"{where}.input_name", f"State input name '{state.input_name}' specified more than once.")
        names.add(state.input_name)
        if state.input_name in inputs:
            raise fail(f"{where}.input_name", f"state input '{state.input_name}' is also a model input; the server "
                                              f"feeds implicit state, clients never send it")
        if state.use_same_buffer_for_input_output or state.use_growable_memory:
            raise fail(where, "'use_same_buffer_for_input_output' and 'use_growable_memory' are not supported by "
                              "tritond (state is kept in the worker's shared memory and copied once per step)")
        if _element_size(state.data_type) == 0 and state.data_type != DataType.TYPE_STRING:
            raise fail(f"{where}.data_type", f"implicit state '{state.input_name}' must have a data type, not "
                                             f"{DataType.Name(state.data_type)}")
        if len(state.initial_state) > 1:
            raise fail(f"{where}.initial_state", f"initial_state field for state input '{state.input_name}' must "
                                                 f"contain exactly one or zero element. Found "
                                                 f"'{len(state.initial_state)}' elements.")
        if state.initial_state:
            _initial_state(state, fail, where, model_path)


def _initial_state(state, fail: Fail, where: str, model_path: str) -> None:
    init = state.initial_state[0]
    name = state.input_name
    if init.data_type != state.data_type:
        raise fail(f"{where}.initial_state", f"The data type used for 'initial_state' field of state '{name}' does "
                                             f"not match the state data type.")
    if not init.name:
        raise fail(f"{where}.initial_state", f"Field 'name' must be set when using initial_state for state input "
                                             f"'{name}'.")
    if len(init.dims) != len(state.dims):
        raise fail(f"{where}.initial_state", f"Number of dimensions in 'initial_state' doesn't match the size of "
                                             f"'state' dimensions for state input '{name}'. {len(init.dims)} != "
                                             f"{len(state.dims)}")
    for d, s in zip(init.dims, state.dims):
        if d == -1:
            raise fail(f"{where}.initial_state", f"'initial_state' field for state input name '{name}' contains "
                                                 f"variable dimensions.")
        if s != -1 and d != s:
            raise fail(f"{where}.initial_state", f"'initial_state' dim for input name '{name}' doesn't match "
                                                 f"'state' dim description. {d} != {s}")
    which = init.WhichOneof("state_data")
    if which is None:
        raise fail(f"{where}.initial_state", f"initial_state setting expects state'{name}' to have state_data set")
    if which == "data_file" and model_path:
        path = os.path.join(model_path, INITIAL_STATE_FOLDER, init.data_file)
        folder = os.path.realpath(os.path.join(model_path, INITIAL_STATE_FOLDER))
        if not os.path.realpath(path).startswith(folder + os.sep) or not os.path.isfile(path):
            raise fail(f"{where}.initial_state.data_file", f"initial state file '{init.data_file}' was not found in "
                                                           f"the model's '{INITIAL_STATE_FOLDER}' folder")
        need = _element_size(init.data_type)
        for d in init.dims:
            need *= d
        have = os.path.getsize(path)
        if need > have:
            raise fail(f"{where}.initial_state.data_file", f"initial_state setting expects {need} bytes, but the "
                                                           f"data provided from {init.data_file}only has {have} bytes.")


def check_sequence_batching(cfg: model_config_pb2.ModelConfig, fail: Fail, model_path: str = "") -> None:
    seq = cfg.sequence_batching
    if cfg.response_cache.enable:
        raise fail("response_cache", f"Response Cache does not currently support model {cfg.name} with sequence "
                                     f"batching scheduler. Please disable the response cache.")
    _controls(cfg, fail)
    for i, size in enumerate(seq.oldest.preferred_batch_size):
        if size <= 0:
            raise fail(f"sequence_batching.oldest.preferred_batch_size[{i}]",
                       f"sequence batching preferred batch size must be positive for {cfg.name}")
        if size > cfg.max_batch_size:
            raise fail(f"sequence_batching.oldest.preferred_batch_size[{i}]",
                       f"sequence batching preferred batch size must be <= max batch size for {cfg.name}")
    if seq.HasField("direct") and not 0.0 <= seq.direct.minimum_slot_utilization <= 1.0:
        raise fail("sequence_batching.direct.minimum_slot_utilization",
                   "sequence batching minimum slot utilization must be in range (0.0, 1.0]")
    _states(cfg, fail, model_path)
