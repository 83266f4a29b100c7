"""A tiny "LLM" with the interface of Triton's vLLM backend, for the OpenAI API and generate_stream.

Its tokens are words of a small vocabulary. At each step the logits come from a generator
seeded by the prompt (so a prompt has its own most likely text), less the repetition
penalties; `temperature` 0 takes the most likely word, otherwise one is sampled, within
`top_p`, by a generator seeded by `seed` (0 when not given): the same request always gets the
same answer, and another seed another one.

`sampling_parameters` (JSON) takes max_tokens (default 16), temperature, top_p, seed, stop
(the text ends before the first stop string found after min_tokens words), min_tokens,
frequency_penalty, presence_penalty, ignore_eos (it has no end-of-sequence token, so it
always does) and logprobs (with `return_logprobs`: each word's log-probability and those of
the `logprobs` most likely words, as vLLM's `logprobs` output); any other key fails the
request, as vLLM refuses an unknown setting. With
`stream` true each word is a response of its own, else the whole text is one. It reports
`num_input_tokens` (the prompt's words) and `num_output_tokens` (the words of that response)
when asked, and prefixes the prompt unless `exclude_input_in_output` is true.

Each request runs on a thread of its own (one instance streams many requests at once). A
request whose client went away (`is_cancelled()`, asked at every word) stops; a max_tokens
above the config parameter `max_tokens_limit` (default 4096) is refused; the config parameter
`cancel_marker_dir` names a directory where each such stop leaves a file (tests read it), and
`token_delay_ms` paces the words like a real model.
"""
import json
import os
import threading
import time
import uuid
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

VOCAB = ["the", "a", "model", "server", "streams", "tokens", "one", "at", "time", "fast", "tiny", "and",
         "stateful", "triton", "python", "answers", "every", "question", "with", "words", "."]
SETTINGS = {"max_tokens", "temperature", "top_p", "seed", "stop", "min_tokens", "frequency_penalty",
            "presence_penalty", "ignore_eos", "logprobs"}
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096


class Cancelled(Exception):
    """The request was cancelled while its words were generated."""


def generate(prompt: str, settings: dict, steps: list | None = None, limit: int = MAX_TOKENS_LIMIT,
             cancelled=lambda: False) -> list:
    """The words of the answer to `prompt`, the last one cut before a stop string; `steps`, when
    given, gets each word's log-probabilities over the vocabulary (of the unscaled logits).
    Raises ValueError for more than `limit` words, Cancelled once `cancelled()` says so (asked
    at every word, so a long answer stops soon)."""
    unknown = set(settings) - SETTINGS
    if unknown:
        raise ValueError(f"tiny_llm does not support the sampling parameter(s) {sorted(unknown)}")
    count = int(settings.get("max_tokens", DEFAULT_MAX_TOKENS))
    if count > limit:
        raise ValueError(f"max_tokens {count} is above tiny_llm's limit of {limit} (its max_tokens_limit parameter)")
    temperature = float(settings.get("temperature", 1.0))
    top_p = float(settings.get("top_p", 1.0))
    frequency = float(settings.get("frequency_penalty", 0.0))
    presence = float(settings.get("presence_penalty", 0.0))
    logits_rng = np.random.default_rng(zlib.crc32(prompt.encode()))
    sample_rng = np.random.default_rng(int(settings.get("seed") or 0) & 0xFFFFFFFFFFFFFFFF)
    used = np.zeros(len(VOCAB))
    words = []
    for _ in range(count):
        if cancelled():
            raise Cancelled
        logits = logits_rng.normal(size=len(VOCAB)) * 3 - frequency * used - presence * (used > 0)
        if temperature == 0:
            pick = int(np.argmax(logits))
        else:
            p = np.exp((logits - logits.max()) / temperature)
            p /= p.sum()
            order = np.argsort(-p)
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
            pick = int(sample_rng.choice(keep, p=p[keep] / p[keep].sum()))
        used[pick] += 1
        words.append(("" if not words else " ") + VOCAB[pick])
        if steps is not None:
            steps.append((pick, logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())))
    words = _cut(words, settings.get("stop") or [], int(settings.get("min_tokens", 0)))
    if steps is not None:
        del steps[len(words):]
    return words


def logprobs_json(words: list, steps: list, top: int) -> str:
    """vLLM's `logprobs` output: per word {token id: {logprob, rank, decoded_token}} for the
    word and the `top` most likely ones."""
    out = []
    for word, (pick, lp) in zip(words, steps):
        order = np.argsort(-lp)
        rank = {int(t): r + 1 for r, t in enumerate(order)}
        ids = [pick] + [int(t) for t in order[:top] if int(t) != pick]
        spaced = word.startswith(" ")
        out.append({str(i): {"logprob": float(lp[i]), "rank": rank[i],
                             "decoded_token": word if i == pick else (" " if spaced else "") + VOCAB[i]}
                    for i in ids})
    return json.dumps(out)


def _cut(words: list, stops: list, min_tokens: int) -> list:
    text = "".join(words)
    start = len("".join(words[:min_tokens]))
    found = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    if not found:
        return words
    end, out, at = min(found), [], 0
    for w in words:
        if at >= end:
            break
        if w[: end - at]:
            out.append(w[: end - at])
        at += len(w)
    return out


def _flag(request, name: str, default: bool) -> bool:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return bool(t.as_numpy().reshape(-1)[0]) if t is not None else default


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(params.get("token_delay_ms", {}).get("string_value", "0")) / 1000
        self.cancel_dir = params.get("cancel_marker_dir", {}).get("string_value", "")
        self.max_tokens_limit = int(params.get("max_tokens_limit", {}).get("string_value", MAX_TOKENS_LIMIT))

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request,), daemon=True).start()
        return None

    def answer(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            sampling = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            settings = json.loads(sampling.as_numpy().reshape(-1)[0]) if sampling is not None else {}
            steps = [] if _flag(request, "return_logprobs", False) else None
            words = generate(prompt, settings, steps, self.max_tokens_limit, request.is_cancelled)
        except Cancelled:
            self.cancelled(0)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        counts = (_flag(request, "return_num_input_tokens", False), _flag(request, "return_num_output_tokens", False))
        stream = _flag(request, "stream", False)
        echo = "" if _flag(request, "exclude_input_in_output", False) else prompt
        top = int(settings.get("logprobs") or 0)
        held = []
        for i, word in enumerate(words):
            if self.delay_s and i:
                time.sleep(self.delay_s)
            if request.is_cancelled():
                self.cancelled(i)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            held.append(word)
            if stream:
                last = i == len(words) - 1
                logprobs = logprobs_json(held, steps[i:i + 1], top) if steps is not None else None
                sender.send(self.response(echo if i == 0 else "", held, prompt, counts, logprobs),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
                held = []
        if not stream or not words:
            logprobs = logprobs_json(held, steps, top) if steps is not None else None
            sender.send(self.response(echo, held, prompt, counts, logprobs),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def response(prefix: str, words: list, prompt: str, counts: tuple, logprobs: str | None):
        outputs = [pb_utils.Tensor("text_output", np.array([(prefix + "".join(words)).encode()], dtype=np.object_))]
        if logprobs is not None:
            outputs.append(pb_utils.Tensor("logprobs", np.array([logprobs.encode()], dtype=np.object_)))
        if counts[0]:
            outputs.append(pb_utils.Tensor("num_input_tokens", np.array([len(prompt.split())], np.uint32)))
        if counts[1]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([len(words)], np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def cancelled(self, sent: int) -> None:
        if self.cancel_dir:
            with open(os.path.join(self.cancel_dir, f"cancelled-{uuid.uuid4().hex}"), "w") as f:
                f.write(str(sent))
