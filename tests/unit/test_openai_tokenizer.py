"""A tokenizer directory's chat template, rendered in Jinja's sandbox, and its token counts."""
import json

import pytest

from chat_tokenizer import render, write_tokenizer
from tritond.frontend.openai.tokenizer import CannotRender, TemplateRejected, Tokenizer, TokenizerError

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")


def test_the_template_renders_the_conversation_and_counts_tokens(tmp_path):
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok")))
    messages = [{"role": "system", "content": "be fast"}, {"role": "user", "content": "hello model"}]
    prompt = tok.render(messages)
    assert prompt == render(messages)
    assert tok.count("hello model .", special_tokens=False) == 3
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tok.render(parts) == "<s><|user|> ab </s> <|assistant|>"


def test_a_template_that_refuses_the_conversation(tmp_path):
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok")))
    with pytest.raises(TemplateRejected, match="roles must be"):
        tok.render([{"role": "tool", "content": "x"}])


def test_messages_the_template_cannot_take_are_the_clients(tmp_path):
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok", "{% for m in messages %}{{ m['content'] + '.' }}"
                                                           "{% endfor %}{{ tools | tojson }}")))
    with pytest.raises(CannotRender):
        tok.render([{"role": "user", "content": None}])
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(CannotRender):
        tok.render([{"role": "user", "content": "x"}], [{"type": "function", "function": {"parameters": deep}}])
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok2", "{{ messages[0].content.upper() }}")))
    with pytest.raises(CannotRender):
        tok.render([{"role": "user"}])


def test_the_sandbox_keeps_templates_from_python(tmp_path):
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok", "{{ messages.__class__.__mro__ }}")))
    with pytest.raises(ValueError, match="the chat template failed"):
        tok.render([{"role": "user", "content": "x"}])
    tok = Tokenizer(str(write_tokenizer(tmp_path / "tok2", "{% set x = messages.append(1) %}{{ x }}")))
    with pytest.raises(ValueError, match="the chat template failed"):
        tok.render([{"role": "user", "content": "x"}])


def test_a_chat_template_file_replaces_the_tokenizers(tmp_path):
    directory = write_tokenizer(tmp_path / "tok")
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    tok = Tokenizer(str(directory), str(tmp_path / "t.jinja"))
    assert tok.render([{"role": "user", "content": "hi"}]) == "HI"


def test_named_templates_take_the_default(tmp_path):
    directory = tmp_path / "tok"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    tok = Tokenizer(str(directory))
    assert tok.render([]) == "D" and tok.encoder is None and tok.count("x", True) is None


@pytest.mark.parametrize("setup, text", [
    (lambda d: None, "not a directory"),
    (lambda d: d.mkdir(), "neither a chat template"),
    (lambda d: (d.mkdir(), (d / "tokenizer_config.json").write_text("{")), "tokenizer_config.json"),
    (lambda d: (d.mkdir(), (d / "tokenizer_config.json").write_text('{"chat_template": "{% if %}"}')),
     "does not compile"),
])
def test_a_directory_that_cannot_serve_is_named(tmp_path, setup, text):
    directory = tmp_path / "tok"
    setup(directory)
    with pytest.raises(TokenizerError, match=text):
        Tokenizer(str(directory))
