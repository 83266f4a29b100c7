"""An OpenAI request as inputs of a model with the interface of Triton's LLM backends, and the
text and token counts read back from its responses.

The model's declared inputs decide the form, as they do for Triton's frontend:
- vLLM's: `text_input`, `stream`, `sampling_parameters` (the sampling settings as one JSON
  string), `exclude_input_in_output`, `return_num_input_tokens`, `return_num_output_tokens`;
- TensorRT-LLM's (a model without `sampling_parameters`): one input per setting
  (`max_tokens`, `temperature`, `top_p`, `frequency_penalty`, `presence_penalty`, `seed`,
  `stop_words`, ...).
Either way the answer is `text_output` (and `num_input_tokens`/`num_output_tokens` where the
model reports them). A setting the client gave that the model has no input for is refused
(400), never dropped. Inputs the model declares but the request does not need are left out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritond.repository.datatypes import WIRE_TO_NUMPY, serialize_bytes
from tritond.wire import schema as S

from ..dataplane import InferResult, InputTensor
from .errors import client_error
from .logprobs import Positions, parse as parse_logprobs
from .requests import Generation

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
EMBEDDING_INPUT = "embedding_request"
# The config parameter with which a model declares the most tokens it generates for a request.
MAX_TOKENS_PARAMETER = "max_tokens_limit"
# TensorRT-LLM's input for an OpenAI setting where the name differs.
TRTLLM_NAMES = {"stop": "stop_words"}


@dataclass(frozen=True)
class Interface:
    """What a model takes and answers, found once per model view."""
    vllm: bool
    inputs: dict[str, S.TensorView]
    batching: bool
    decoupled: bool
    logprobs: bool            # it answers `logprobs` (vLLM's JSON) when `return_logprobs` asks


def interface(entry: S.ModelEntry) -> Interface:
    """The model's LLM interface, or 400 naming what it lacks."""
    view = entry.view or S.ModelView()
    text = view.inputs.get(TEXT_INPUT)
    if text is None or text.datatype != "BYTES" or TEXT_OUTPUT not in view.outputs:
        raise client_error(f"model '{entry.name}' does not have the interface of an LLM: it needs a BYTES input "
                           f"'{TEXT_INPUT}' and an output '{TEXT_OUTPUT}'")
    logprobs = "return_logprobs" in view.inputs and "logprobs" in view.outputs
    return Interface("sampling_parameters" in view.inputs, view.inputs, view.max_batch_size > 0, view.decoupled,
                     logprobs)


def limit_max_tokens(entry: S.ModelEntry, gen: Generation) -> None:
    """Hold the request to the model's declared limit (its config parameter max_tokens_limit),
    before it takes a model instance's time: a max_tokens the client set above it is refused
    (400), the default one is lowered to it."""
    parameters = (entry.config or {}).get("parameters") or {}
    raw = (parameters.get(MAX_TOKENS_PARAMETER) or {}).get("string_value")
    if raw is None or not str(raw).strip().isdigit() or gen.max_tokens <= int(raw):
        return
    if not gen.max_tokens_given:
        gen.max_tokens = int(raw)
        return
    raise client_error(f"max_tokens {gen.max_tokens} exceeds the {MAX_TOKENS_PARAMETER} {raw.strip()} of model "
                       f"'{entry.name}'")


def _shape(name: str, t: S.TensorView, batching: bool, count: int) -> list[int]:
    """The input's shape for `count` elements: the innermost variable dimension holds them."""
    dims = list(t.dims)
    fixed = 1
    for d in dims:
        if d != -1:
            fixed *= d
    variable = [i for i, d in enumerate(dims) if d == -1]
    if (variable and count % fixed) or (not variable and fixed != count):
        raise client_error(f"the model's input '{name}' (dims {dims}) cannot hold {count} value(s)")
    if variable:
        for i in variable:
            dims[i] = 1
        dims[variable[-1]] = count // fixed
    return ([1] if batching else []) + dims


def _tensor(model: str, iface: Interface, name: str, values: list[Any]) -> InputTensor:
    t = iface.inputs[name]
    shape = _shape(name, t, iface.batching, len(values))
    if t.datatype == "BYTES":
        data = serialize_bytes(np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=object))
        return InputTensor(name, "BYTES", shape, data)
    dtype = WIRE_TO_NUMPY.get(t.datatype)
    try:
        if dtype is None or any(isinstance(v, str) for v in values):
            raise ValueError
        arr = np.array(values, dtype=dtype)
        if dtype.kind in "iub" and arr.tolist() != list(values):    # wrapped, truncated or cast to bool
            raise ValueError
    except (ValueError, TypeError, OverflowError):
        raise client_error(f"model '{model}' takes '{name}' as {t.datatype}, which cannot hold {values}") from None
    return InputTensor(name, t.datatype, shape, arr.tobytes())


def inputs(model: str, iface: Interface, gen: Generation, seed: int | None) -> list[InputTensor]:
    """The model inputs of one choice of `gen` (`seed`: this choice's)."""
    stream = gen.stream and iface.decoupled
    sampling = dict(gen.sampling)
    if seed is not None:
        sampling["seed"] = seed
    out = [_tensor(model, iface, TEXT_INPUT, [gen.prompt])]
    flags = {"stream": stream, "exclude_input_in_output": True, "return_logprobs": gen.logprobs is not None,
             "return_num_input_tokens": True, "return_num_output_tokens": True}
    if gen.logprobs is not None:
        if not (iface.logprobs and iface.vllm):
            raise client_error(f"model '{model}' does not return logprobs: that needs vLLM's interface with an input "
                               f"'return_logprobs' and an output 'logprobs'")
        sampling["logprobs"] = gen.logprobs
    if iface.vllm:
        sampling["max_tokens"] = gen.max_tokens
        out.append(_tensor(model, iface, "sampling_parameters", [json.dumps(sampling)]))
    else:
        settings = {TRTLLM_NAMES.get(k, k): v for k, v in sampling.items()}
        missing = [k for k, v in sampling.items() if TRTLLM_NAMES.get(k, k) not in iface.inputs]
        if missing:
            raise client_error(f"model '{model}' does not support {', '.join(repr(k) for k in missing)}: it has no "
                               f"input {' or '.join(repr(TRTLLM_NAMES.get(k, k)) for k in missing)}")
        if "max_tokens" in iface.inputs:
            settings["max_tokens"] = gen.max_tokens
        elif gen.max_tokens_given:
            raise client_error(f"model '{model}' does not support 'max_tokens': it has no input 'max_tokens'")
        for name, value in settings.items():
            out.append(_tensor(model, iface, name, value if isinstance(value, list) else [value]))
    for name, value in flags.items():
        if name in iface.inputs:
            out.append(_tensor(model, iface, name, [value]))
    return out


def embedding_inputs(entry: S.ModelEntry, text: str | list[int], dimensions: int | None) -> list[InputTensor]:
    """The inputs of an embedding request to a model with vLLM's embedding interface: the
    request as one JSON string in `embedding_request`; its answer is `text_output`, the
    embedding as a JSON list."""
    view = entry.view or S.ModelView()
    t = view.inputs.get(EMBEDDING_INPUT)
    if t is None or t.datatype != "BYTES" or TEXT_OUTPUT not in view.outputs:
        raise client_error(f"model '{entry.name}' is not an embedding model: it needs a BYTES input "
                           f"'{EMBEDDING_INPUT}' and an output '{TEXT_OUTPUT}'")
    iface = Interface(False, view.inputs, view.max_batch_size > 0, view.decoupled, False)
    pooling = {"dimensions": [dimensions]} if dimensions is not None else {}
    out = [_tensor(entry.name, iface, EMBEDDING_INPUT, [json.dumps({"input": text, "pooling_params": pooling})])]
    if "return_num_input_tokens" in view.inputs:
        out.append(_tensor(entry.name, iface, "return_num_input_tokens", [True]))
    return out


@dataclass
class Answer:
    """What one model response says: its text and the token counts it reports."""
    text: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    logprobs: Positions | None = None


def answer(result: InferResult | None) -> Answer:
    """The text of a response (copied out: the response's memory is released after this)."""
    if result is None:
        return Answer("")
    text, counts, logprobs = "", {}, None
    for t in result.outputs:
        if t.name in (TEXT_OUTPUT, "logprobs") and t.data is not None:
            joined = "".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                             for x in t.as_numpy().reshape(-1).tolist())
            if t.name == TEXT_OUTPUT:
                text = joined
            else:
                logprobs = parse_logprobs(joined)
        elif t.name in ("num_input_tokens", "num_output_tokens") and t.data is not None:
            values = t.as_numpy().reshape(-1)
            if values.size:
                counts[t.name] = int(values[0])
    return Answer(text, counts.get("num_input_tokens"), counts.get("num_output_tokens"), logprobs)
