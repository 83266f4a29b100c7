"""A tokenizer directory built here, as Hugging Face saves one (nothing downloaded): a word-level
`tokenizer.json` made with the `tokenizers` package over the tiny_llm example's vocabulary, and
`tokenizer_config.json` with a Jinja chat template in the usual form."""
from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant') }}"
    "{% endif %}"
    "<|{{ message['role'] }}|> "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    " {{ eos_token }} "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = ["the", "a", "model", "server", "streams", "tokens", "one", "at", "time", "fast", "tiny", "and",
         "stateful", "triton", "python", "answers", "every", "question", "with", "words", ".", "hello", "hi"]


def write_tokenizer(directory: Path, template: str = CHAT_TEMPLATE) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def render(messages: list[dict]) -> str:
    """What CHAT_TEMPLATE renders for `messages` (string contents), written out by hand."""
    return "<s>" + "".join(f"<|{m['role']}|> {m['content']} </s> " for m in messages) + "<|assistant|>"
