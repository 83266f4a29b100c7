"""An OpenAI request as the inputs of a model with vLLM's or TensorRT-LLM's interface, and the
text and token counts read back."""
import json

import numpy as np
import pytest

from tritond.frontend.dataplane import InferResult, OutputTensor
from tritond.frontend.openai.errors import ApiError
from tritond.frontend.openai.mapping import answer, limit_max_tokens, inputs, interface
from tritond.frontend.openai.requests import Generation
from tritond.repository.datatypes import bytes_to_array, serialize_bytes
from tritond.wire import schema as S


def entry(inputs_: dict, outputs: dict | None = None, batching: int = 0, decoupled: bool = True) -> S.ModelEntry:
    view = S.ModelView(max_batch_size=batching, decoupled=decoupled,
                       inputs={n: S.TensorView(n, t, d) for n, (t, d) in inputs_.items()},
                       outputs={n: S.TensorView(n, t, d) for n, (t, d) in (outputs or {"text_output": ("BYTES", [-1])})
                                .items()})
    return S.ModelEntry("llm", 1, S.ModelState.READY, view=view)


VLLM = {"text_input": ("BYTES", [1]), "stream": ("BOOL", [1]), "sampling_parameters": ("BYTES", [1]),
        "exclude_input_in_output": ("BOOL", [1]), "return_num_input_tokens": ("BOOL", [1])}
TRTLLM = {"text_input": ("BYTES", [-1]), "stream": ("BOOL", [1]), "max_tokens": ("INT32", [1]),
          "temperature": ("FP32", [1]), "seed": ("UINT64", [1]), "stop_words": ("BYTES", [-1])}


def values(t):
    arr = bytes_to_array(t.data, t.datatype, t.shape)
    return [x.decode() if isinstance(x, bytes) else x for x in arr.reshape(-1).tolist()]


def by_name(tensors):
    return {t.name: (t.shape, values(t)) for t in tensors}


def test_vllm_form_puts_the_settings_in_one_json_input():
    e = entry(VLLM)
    iface = interface(e)
    gen = Generation("llm", "hello", 8, stream=True, sampling={"temperature": 0.5, "stop": ["."], "seed": 1})
    got = by_name(inputs("llm", iface, gen, seed=3))
    assert got["text_input"] == ([1], ["hello"])
    assert got["stream"] == ([1], [True])
    assert got["exclude_input_in_output"] == ([1], [True])
    assert got["return_num_input_tokens"] == ([1], [True])
    assert json.loads(got["sampling_parameters"][1][0]) == {"temperature": 0.5, "stop": ["."], "seed": 3,
                                                            "max_tokens": 8}
    assert "return_num_output_tokens" not in got      # not declared by this model


def test_trtllm_form_has_an_input_per_setting_shaped_by_the_model():
    e = entry(TRTLLM, batching=4)
    gen = Generation("llm", "hi", 5, sampling={"temperature": 0.25, "stop": ["a", "b"], "seed": 7})
    got = by_name(inputs("llm", interface(e), gen, seed=None))
    assert got["text_input"] == ([1, 1], ["hi"])
    assert got["stop_words"] == ([1, 2], ["a", "b"])
    assert got["max_tokens"] == ([1, 1], [5])
    assert got["temperature"] == ([1, 1], [0.25])
    assert got["seed"] == ([1, 1], [7])
    assert got["stream"] == ([1, 1], [False])


def test_a_setting_the_model_has_no_input_for_is_refused():
    e = entry({"text_input": ("BYTES", [1])})
    gen = Generation("llm", "hi", 5, sampling={"top_p": 0.5})
    with pytest.raises(ApiError, match="model 'llm' does not support 'top_p': it has no input 'top_p'"):
        inputs("llm", interface(e), gen, None)
    with pytest.raises(ApiError, match="does not support 'max_tokens'"):
        inputs("llm", interface(e), Generation("llm", "hi", 5, max_tokens_given=True), None)
    assert by_name(inputs("llm", interface(e), Generation("llm", "hi", 5), None)) == {"text_input": ([1], ["hi"])}


def test_logprobs_need_a_model_that_returns_them():
    gen = Generation("llm", "hi", 5, logprobs=2)
    with pytest.raises(ApiError, match="model 'llm' does not return logprobs"):
        inputs("llm", interface(entry(VLLM)), gen, None)
    e = entry({**VLLM, "return_logprobs": ("BOOL", [1])}, {"text_output": ("BYTES", [-1]), "logprobs": ("BYTES", [1])})
    got = by_name(inputs("llm", interface(e), gen, None))
    assert got["return_logprobs"] == ([1], [True]) and json.loads(got["sampling_parameters"][1][0])["logprobs"] == 2
    assert by_name(inputs("llm", interface(e), Generation("llm", "hi", 5), None))["return_logprobs"] == ([1], [False])


def test_logprobs_in_the_openai_forms():
    from tritond.frontend.openai.logprobs import for_chat, for_completion
    positions = [{"7": {"logprob": -0.5, "rank": 2, "decoded_token": "a"},
                  "3": {"logprob": -0.2, "rank": 1, "decoded_token": "b"}},
                 {"4": {"logprob": -0.1, "rank": 1, "decoded_token": " c"}}]
    chat = for_chat(positions)["content"]
    assert [(c["token"], c["logprob"], c["bytes"]) for c in chat] == [("a", -0.5, [97]), (" c", -0.1, [32, 99])]
    assert [t["token"] for t in chat[0]["top_logprobs"]] == ["b", "a"]
    assert for_completion(positions, 3) == {"text_offset": [3, 4], "token_logprobs": [-0.5, -0.1],
                                            "tokens": ["a", " c"], "top_logprobs": [{"b": -0.2, "a": -0.5},
                                                                                    {" c": -0.1}]}


def test_a_value_the_models_type_cannot_hold_is_refused():
    e = entry({"text_input": ("BYTES", [1]), "seed": ("UINT32", [1])})
    with pytest.raises(ApiError, match="takes 'seed' as UINT32"):
        inputs("llm", interface(e), Generation("llm", "hi", 5, sampling={"seed": -1}), None)


def test_a_model_without_the_llm_interface_is_refused():
    with pytest.raises(ApiError, match="does not have the interface of an LLM"):
        interface(entry({"INPUT0": ("FP32", [-1])}, {"OUTPUT0": ("FP32", [-1])}))


def test_answer_reads_text_and_counts():
    text = serialize_bytes(np.array([b"he", "ll\u00f6".encode()], dtype=object))
    result = InferResult("llm", 1, "", [OutputTensor("text_output", "BYTES", [1, 2], text),
                                        OutputTensor("num_output_tokens", "UINT32", [1],
                                                     np.array([3], np.uint32).tobytes())])
    a = answer(result)
    assert (a.text, a.prompt_tokens, a.output_tokens) == ("hell\u00f6", None, 3)
    assert answer(None).text == ""


def test_a_max_tokens_above_the_models_declared_limit_is_refused():
    e = entry(VLLM)
    e.config = {"parameters": {"max_tokens_limit": {"string_value": "64"}}}
    limit_max_tokens(e, Generation("llm", "p", 64, max_tokens_given=True))
    default = Generation("llm", "p", 100)
    limit_max_tokens(e, default)
    assert default.max_tokens == 64
    with pytest.raises(ApiError) as info:
        limit_max_tokens(e, Generation("llm", "p", 65, max_tokens_given=True))
    assert info.value.status == 400 and info.value.message == \
        "max_tokens 65 exceeds the max_tokens_limit 64 of model 'llm'"
    limit_max_tokens(entry(VLLM), Generation("llm", "p", 10**9, max_tokens_given=True))    # no limit declared
