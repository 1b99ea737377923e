"""One sampling filter (temperature, top-k, top-p): the distribution plain decoding and speculative acceptance draw from.

Exact speculative sampling emits tokens distributed as plain decoding only if the target distribution
p in its acceptance rule is the very distribution the plain sampler draws from, so both call
`token_probs` here and draw with `torch.multinomial` on its fp64 result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """Token sampling: temperature 0 (or top_k 1) is greedy; top_k -1 and top_p 1 are off."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if type(self.top_k) is not int or not (self.top_k == -1 or self.top_k >= 1):
            raise ValueError(f"top_k must be -1 (off) or a positive integer, got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


GREEDY = Sampling()


def token_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution one token is drawn from ([..., V] logits -> [..., V] fp64 probabilities):
    temperature, then top-k, then top-p; greedy is the one-hot of the first maximum."""
    x = logits.double()
    if sampling.greedy:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).double()
    x = x / sampling.temperature
    if 0 < sampling.top_k < x.shape[-1]:
        kth = x.topk(sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -torch.inf)
    probs = x.softmax(-1)
    if sampling.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token once the more likely ones already reach top_p (the most likely always stays)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> int:
    """One token from [V] logits: argmax when greedy (the first maximum), else a draw from token_probs."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(token_probs(logits, sampling), 1, generator=generator))
