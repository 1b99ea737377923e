"""Held-out perplexity of a model on a token stream, and the unigram baseline on the same targets."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..model.model import V41Model
from .trainer import sequence_logits


@dataclass(frozen=True)
class Perplexity:
    nll: float  # mean nats per predicted token
    tokens: int

    @property
    def value(self) -> float:
        return math.exp(self.nll)


def chunks(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping [n, seq_len + 1] windows (consecutive windows share their edge token); the
    first token of each window is context only, the other seq_len are predicted."""
    n = (stream.numel() - 1) // seq_len
    if n == 0:
        raise ValueError(f"stream of {stream.numel()} tokens holds no window of {seq_len + 1}")
    return torch.stack([stream[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)])


@torch.no_grad()
def model_perplexity(model: V41Model, stream: torch.Tensor, seq_len: int = 256, batch: int = 8) -> Perplexity:
    windows = chunks(stream, seq_len)
    total = 0.0
    for a in range(0, windows.shape[0], batch):
        rows = windows[a : a + batch]
        logits = sequence_logits(model, rows[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten(), reduction="sum"))
    count = windows.shape[0] * seq_len
    return Perplexity(total / count, count)


def unigram_perplexity(train_stream: torch.Tensor, stream: torch.Tensor, vocab_size: int,
                       seq_len: int = 256) -> Perplexity:
    """Add-one smoothed token frequencies of the training stream, scored on model_perplexity's targets."""
    counts = torch.bincount(train_stream, minlength=vocab_size).double() + 1.0
    logp = torch.log(counts / counts.sum())
    targets = chunks(stream, seq_len)[:, 1:].flatten()
    return Perplexity(float(-logp[targets].mean()), targets.numel())
