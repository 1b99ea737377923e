"""Tokenizer loading, incremental detokenization of multi-byte text, chat templates."""

from __future__ import annotations

import json

import pytest

from sglang_asym.runtime.http.chat_template import normalize_messages, render_chat
from sglang_asym.runtime.http.errors import ApiError
from sglang_asym.runtime.http.tokenizer import IncrementalDetokenizer, TextTokenizer

from .fakes import BOS, EOS, REPLY


def test_loads_special_tokens_and_eos_ids(tokenizer, checkpoint_dir):
    assert tokenizer.bos_token == BOS and tokenizer.eos_token == EOS
    assert tokenizer.eos_token_ids == (1,)
    assert tokenizer.tokenizer.token_to_id(EOS) == 1
    assert tokenizer.chat_template is None
    assert tokenizer.vocab_size == 300
    assert tokenizer.decode(tokenizer.encode(REPLY)) == REPLY


def test_generation_config_adds_eos_ids_and_named_templates(tmp_path, checkpoint_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((checkpoint_dir / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 0]}))
    loaded = TextTokenizer.from_dir(tmp_path)
    assert loaded.eos_token_ids == (1, 0)
    assert loaded.chat_template == "D"


def test_missing_tokenizer_and_unknown_eos_are_clear_errors(tmp_path, checkpoint_dir):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in"):
        TextTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((checkpoint_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|nope|>"}}))
    with pytest.raises(ValueError, match=r"eos_token '<\|nope\|>' is not in the vocabulary"):
        TextTokenizer.from_dir(tmp_path)


def test_incremental_detokenizer_never_splits_a_character(tokenizer):
    ids = tokenizer.encode(REPLY)
    pieces = [tokenizer.tokenizer.id_to_token(i) for i in ids]
    assert len(ids) > len(REPLY.split()), "the reply must span several byte tokens"
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add([token_id]) for token_id in ids]
    deltas.append(detok.finish())
    assert "".join(deltas) == REPLY == detok.text
    assert all("\ufffd" not in d for d in deltas), (pieces, deltas)
    assert deltas.count("") >= 1  # '✓' is 3 bytes over several tokens: held back until complete


def test_incremental_detokenizer_skips_special_tokens_unless_asked(tokenizer):
    ids = [*tokenizer.encode("ab"), 1]
    plain = IncrementalDetokenizer(tokenizer)
    plain.add(ids)
    assert plain.finish() == "" and plain.text == "ab"
    raw = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    raw.add(ids)
    raw.finish()
    assert raw.text == "ab" + EOS


def test_default_chat_template_format():
    messages = normalize_messages([{"role": "system", "content": "S"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert render_chat(messages, None, BOS, EOS) == f"{BOS}<|system|>\nS\n<|user|>\nab\n<|assistant|>\n"
    assert render_chat(messages, None, None, None, add_generation_prompt=False) == "<|system|>\nS\n<|user|>\nab\n"


def test_jinja_chat_template_is_rendered_in_a_sandbox():
    template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat(messages, template, "<s>", "</s>") == "<s>[user]hi[assistant]"
    with pytest.raises(ApiError, match="chat template: no system role"):
        render_chat(messages, "{{ raise_exception('no system role') }}", None, None)
    with pytest.raises(ApiError, match="chat template failed"):
        render_chat(messages, "{% for %}", None, None)


@pytest.mark.parametrize("raw, message", [
    ([], "messages must be a non-empty list"),
    ("hi", "messages must be a non-empty list"),
    ([{"role": "robot", "content": "x"}], "messages[0].role must be one of"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content: only text parts are supported, got 'image_url'"),
    ([{"role": "user", "content": 5}], "messages[0].content must be a string or a list of text parts"),
])
def test_bad_messages_are_400(raw, message):
    with pytest.raises(ApiError) as info:
        normalize_messages(raw)
    assert info.value.status == 400 and message in info.value.message
