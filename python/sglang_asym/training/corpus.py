"""The training text: the interpreter's own documentation topics (`pydoc_data.topics`), split by paragraph.

Every Python installation carries this text, so training needs no download. Topics are sorted by name
and cut into paragraphs at blank lines; counting paragraphs across all topics, every
`heldout_every`-th one is held out (perplexity and the KL benchmark read only those). Topics differ
in length by 100x, so a split by topic would leave too little held-out text for 4096-token prompts.
Each part keeps one text per topic (its paragraphs rejoined); token streams put the tokenizer's BOS id
before each text, as the servers do before each prompt."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

HELDOUT_EVERY = 10


@dataclass(frozen=True)
class Corpus:
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def sha256(self) -> str:
        """Fingerprint of both parts (the text differs between Python releases)."""
        digest = hashlib.sha256()
        for part in (self.train, self.heldout):
            for text in part:
                digest.update(text.encode())
                digest.update(b"\0")
            digest.update(b"\1")
        return digest.hexdigest()


def pydoc_corpus(heldout_every: int = HELDOUT_EVERY) -> Corpus:
    from pydoc_data.topics import topics

    if heldout_every < 2:
        raise ValueError(f"heldout_every must be at least 2, got {heldout_every}")
    train: list[str] = []
    heldout: list[str] = []
    count = 0
    for name in sorted(topics):
        parts: tuple[list[str], list[str]] = ([], [])
        for paragraph in topics[name].strip().split("\n\n"):
            if paragraph.strip():
                parts[count % heldout_every == heldout_every - 1].append(paragraph)
                count += 1
        for texts, kept in zip((train, heldout), parts):
            if kept:
                texts.append("\n\n".join(kept))
    return Corpus(tuple(train), tuple(heldout))


def token_stream(tokenizer: Tokenizer, texts: tuple[str, ...], bos_id: int) -> torch.Tensor:
    """[BOS] + ids of each text, concatenated: a 1-D int64 tensor."""
    ids: list[int] = []
    for text in texts:
        ids.append(bos_id)
        ids.extend(tokenizer.encode(text, add_special_tokens=False).ids)
    return torch.tensor(ids, dtype=torch.int64)


def spread_prompts(stream: torch.Tensor, length: int, count: int) -> list[torch.Tensor]:
    """`count` crops of `length` tokens spread evenly over the stream (first at 0, last at the end);
    they overlap when the stream is shorter than count * length."""
    if stream.numel() < length:
        raise ValueError(f"stream of {stream.numel()} tokens is shorter than one {length}-token prompt")
    last = stream.numel() - length
    starts = [0] if count == 1 else [k * last // (count - 1) for k in range(count)]
    return [stream[s : s + length].clone() for s in starts]
