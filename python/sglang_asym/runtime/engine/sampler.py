"""Token sampling for the runtime: per-request seeded generators; the draw itself is `sglang_asym.sampling`'s."""

from __future__ import annotations

import torch

from ...sampling import sample_token
from ..engine_api import SamplingParams


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator:
    """Per-request RNG: the request's seed when given, else a server-chosen one (reproducible in logs)."""
    return torch.Generator().manual_seed(params.seed if params.seed is not None else fallback_seed)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from [V] logits under the request's settings (the filter speculative acceptance uses)."""
    return sample_token(logits, params.token_sampling, generator)
