"""A toy token-streaming "LLM" for decoupled serving: for a prompt it streams `max_tokens`
(default 16) tokens, one response each, drawn from a tiny vocabulary by a generator seeded
with the prompt, so the same prompt always streams the same text.

Each request is answered from a thread of its own (execute() returns at once, so one instance
streams many requests at a time); a request whose client went away (`is_cancelled()`) stops
early. The parameter `token_delay_ms` paces the tokens like a real model would.
"""
import json
import threading
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

VOCAB = ["the", "a", "model", "server", "streams", "tokens", "one", "at", "time", "fast",
         "tiny", "and", "stateful", "triton", "python", "."]
DEFAULT_TOKENS = 16


def tokens(prompt: bytes, count: int) -> list:
    """The text the model streams for `prompt` (also the reference clients compare with)."""
    rng = np.random.default_rng(zlib.crc32(prompt))
    return [VOCAB[i] for i in rng.integers(len(VOCAB), size=count)]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(params.get("token_delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,), daemon=True).start()
        return None

    def stream(self, request):
        sender = request.get_response_sender()
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        count = int(limit.as_numpy().reshape(-1)[0]) if limit is not None else DEFAULT_TOKENS
        for token in tokens(prompt, count):
            if request.is_cancelled():
                break
            out = pb_utils.Tensor("text_output", np.array([token.encode()], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            if self.delay_s:
                time.sleep(self.delay_s)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
