"""Token sampling from one position's logits: greedy, temperature, top-k, top-p, per-request seed."""

from __future__ import annotations

import torch

from ..engine_api import SamplingParams


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator:
    """Per-request RNG: the request's seed when given, else a server-chosen one (reproducible in logs)."""
    return torch.Generator().manual_seed(params.seed if params.seed is not None else fallback_seed)


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from (temperature, then top-k, then top-p), fp64, sums to 1."""
    scaled = logits.double() / max(params.temperature, 1e-6)
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep_sorted = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(0, order, keep_sorted)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.is_greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(filtered_probs(logits, params).float(), 1, generator=generator))
