"""A model's tokenizer directory (`--tokenizer DIR`, as Hugging Face saves one): its chat template,
rendered with Jinja as transformers renders it, and its token counts for `usage`.

Nothing is downloaded: the directory holds `tokenizer_config.json` (with `chat_template`, or a
`chat_template.jinja` beside it, or the template comes from `--chat-template FILE`) and, for
token counts, `tokenizer.json` (read by the `tokenizers` package). Templates run in Jinja's
immutable sandbox, so a template can neither reach Python objects nor change its inputs.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

PACKAGES_HINT = "pip install 'tritond[openai]'"


class TokenizerError(ValueError):
    """The directory or template cannot serve (said at startup, naming the file)."""


class TemplateRejected(ValueError):
    """The chat template refused the conversation (its `raise_exception`)."""


class CannotRender(ValueError):
    """The messages hold what the chat template cannot take (a null content, nesting too deep
    for it): the client's to mend."""


def _special(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _template_text(config: dict, directory: str) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):       # named templates: the default one, else the first
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None:
        path = os.path.join(directory, "chat_template.jinja")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                template = f.read()
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{directory}/tokenizer_config.json: 'chat_template' is not a string")
    return template or ""


def _raise(message: str) -> None:
    raise TemplateRejected(message)


def _environment():
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError(f"chat templates need the jinja2 package: {PACKAGES_HINT}") from None

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                                        undefined=jinja2.Undefined)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env, jinja2.TemplateError


class Tokenizer:
    """The chat template and token counter of one tokenizer directory."""

    def __init__(self, directory: str = "", chat_template_file: str = "") -> None:
        config: dict = {}
        if directory:
            if not os.path.isdir(directory):
                raise TokenizerError(f"--tokenizer {directory}: not a directory (a local tokenizer directory, "
                                     f"as saved by Hugging Face, is needed: nothing is downloaded)")
            path = os.path.join(directory, "tokenizer_config.json")
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        config = json.load(f)
                except (OSError, ValueError) as e:
                    raise TokenizerError(f"{path}: {e}") from None
                if not isinstance(config, dict):
                    raise TokenizerError(f"{path}: not a JSON object")
        if chat_template_file:
            try:
                with open(chat_template_file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise TokenizerError(f"--chat-template {chat_template_file}: {e.strerror}") from None
        else:
            text = _template_text(config, directory)
        self.bos_token = _special(config.get("bos_token"))
        self.eos_token = _special(config.get("eos_token"))
        self.template = None
        if text:
            env, template_error = _environment()
            try:
                self.template = env.from_string(text)
            except template_error as e:
                raise TokenizerError(f"the chat template does not compile: {e}") from None
        self.encoder = None
        vocab = os.path.join(directory, "tokenizer.json") if directory else ""
        if vocab and os.path.isfile(vocab):
            try:
                from tokenizers import Tokenizer as HfTokenizer
            except ImportError:
                raise TokenizerError(f"token counts from {vocab} need the tokenizers package: {PACKAGES_HINT}") \
                    from None
            try:
                self.encoder = HfTokenizer.from_file(vocab)
            except Exception as e:      # the tokenizers package raises its own Exception types
                raise TokenizerError(f"{vocab}: {e}") from None
        if self.template is None and self.encoder is None:
            raise TokenizerError(f"{directory or chat_template_file}: neither a chat template (tokenizer_config.json's "
                                 f"'chat_template', chat_template.jinja) nor tokenizer.json")

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt of a conversation (offering `tools`), ending where the assistant's answer begins. Raises
        TemplateRejected when the template refuses it, CannotRender when it cannot take what the messages
        hold, ValueError when the template fails."""
        if self.template is None:
            raise ValueError("the tokenizer has no chat template")
        from jinja2 import UndefinedError
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                        eos_token=self.eos_token, tools=tools)
        except TemplateRejected:
            raise
        except (TypeError, UndefinedError, RecursionError) as e:
            raise CannotRender(str(e) or type(e).__name__) from None
        except Exception as e:      # whatever the template's expressions raise
            raise ValueError(f"the chat template failed: {e}") from None

    def count(self, text: str, special_tokens: bool) -> int | None:
        """The number of tokens of `text` (None without tokenizer.json); `special_tokens` adds
        what the tokenizer adds around a prompt (a chat prompt already holds them)."""
        if self.encoder is None:
            return None
        return len(self.encoder.encode(text, add_special_tokens=special_tokens).ids)
