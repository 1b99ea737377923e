"""TextTokenizer (a checkpoint's tokenizer.json + tokenizer_config.json) and incremental detokenization."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tokenizers import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"  # what a byte-level decoder shows for an incomplete UTF-8 sequence


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


@dataclass(frozen=True)
class TextTokenizer:
    """Encode/decode with a `tokenizers` tokenizer plus the facts the front needs from its config."""

    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(root / "tokenizer_config.json")
        bos, eos = _token_content(config.get("bos_token")), _token_content(config.get("eos_token"))
        eos_ids: list[int] = []
        if eos is not None:
            eos_id = tokenizer.token_to_id(eos)
            if eos_id is None:
                raise ValueError(f"{root}: eos_token {eos!r} is not in the vocabulary")
            eos_ids.append(eos_id)
        generation_eos = _read_json(root / "generation_config.json").get("eos_token_id")
        for token_id in generation_eos if isinstance(generation_eos, list) else [generation_eos]:
            if isinstance(token_id, int) and token_id not in eos_ids:
                eos_ids.append(token_id)
        return cls(tokenizer, tuple(eos_ids), bos, eos, _pick_chat_template(config.get("chat_template")))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _pick_chat_template(value: Any) -> str | None:
    """HF allows one template string or a list of named templates; 'default' is the chat one."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) and chosen else None
    return None


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas that never split a multi-byte character.

    Only a short window is decoded per step: the tokens since the last emitted boundary, with the
    previous step's tokens as left context (decoding a lone suffix can differ from the suffix of the
    whole). Text whose decode still ends in U+FFFD waits for the next token; `finish()` flushes it.
    """

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def add(self, new_ids: Iterable[int]) -> str:
        self._ids.extend(new_ids)
        window = self._ids[self._prefix_offset:]
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(window)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """The last delta, so that `text` equals the decode of all tokens."""
        full = self._decode(self._ids)
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text = full
        self._prefix_offset = self._read_offset = len(self._ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""
