"""Models with deterministic random weights for tests (no disk)."""

from __future__ import annotations

from functools import lru_cache

import torch

from sglang_asym.checkpoint.random_init import random_weights
from sglang_asym.config import V41Config
from sglang_asym.model import V41Model


@lru_cache(maxsize=None)
def weights(preset: str, seed: int) -> dict[str, torch.Tensor]:
    return random_weights(V41Config.preset(preset), seed)


def build(preset: str, seed: int = 0, role: str = "full", cache_quant: str = "none") -> V41Model:
    cfg = V41Config.preset(preset)
    model = V41Model(cfg, role=role, cache_quant=cache_quant)
    w = weights(preset, seed)
    model.load_weights({k: v for k, v in w.items() if k in model.expected_tensor_names()})
    return model


def prompt(cfg: V41Config, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


