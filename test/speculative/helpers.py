"""Shared tiny-preset models for the speculative tests."""

from __future__ import annotations

from functools import lru_cache

from model.helpers import build
from sglang_asym.cache import CacheSizing
from sglang_asym.model import V41Model
from sglang_asym.model.dspark import DSparkDrafter, random_drafter_weights

SIZING = CacheSizing(max_requests=2, max_tokens=512)


@lru_cache(maxsize=None)
def target(seed: int = 0) -> V41Model:
    return build("tiny", seed)


@lru_cache(maxsize=None)
def dspark(seed: int = 0, drafter_seed: int = 1) -> DSparkDrafter:
    model = target(seed)
    drafter = DSparkDrafter(model)
    drafter.load_weights(random_drafter_weights(model.cfg, drafter_seed))
    return drafter
