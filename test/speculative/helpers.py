"""Shared tiny-preset models and the split-with-speculation pipeline for the speculative tests."""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import torch

from model.helpers import build
from sglang_asym.asym import run_prefix, run_reference, run_window
from sglang_asym.cache import CacheSet, RequestCache
from sglang_asym.model import V41Model
from sglang_asym.model.dspark import DSparkDrafter, random_drafter_weights
from sglang_asym.model.steps import greedy_continue
from sglang_asym.speculative import GREEDY, Drafter, SpecRequest, generate, sample_token
from sglang_asym.split import SplitPlan

W = 128
# The prompt lengths of the split acceptance list: no prefix, around the window edge, odd boundaries, long.
SPLIT_LENGTHS = (1, 2, W - 1, W, W + 1, W + 2, 2 * W + 1, 1000, 4097)


def start_request(drafter: Drafter, cache: RequestCache, first_token: int, captured: Mapping[int, torch.Tensor],
                  first_pos: int) -> SpecRequest:
    """After the forward that produced the first token's logits (prefill or the window step, run with
    capture=drafter.feature_layers over positions [first_pos, cache.pos)): a request ready to draft."""
    state = drafter.new_state()
    drafter.observe(state, captured, first_pos)
    return SpecRequest(cache, state, int(first_token))


@lru_cache(maxsize=None)
def target(seed: int = 0) -> V41Model:
    return build("tiny", seed)


def random_dspark(model: V41Model, drafter_seed: int) -> DSparkDrafter:
    drafter = DSparkDrafter(model)
    drafter.load_weights(random_drafter_weights(model.cfg, drafter_seed))
    return drafter


@lru_cache(maxsize=None)
def dspark(seed: int = 0, drafter_seed: int = 1) -> DSparkDrafter:
    return random_dspark(target(seed), drafter_seed)


def reference_greedy(model: V41Model, cache_set: CacheSet, tokens: torch.Tensor, split: SplitPlan,
                     new_tokens: int) -> list[int]:
    """The single-process reference's greedy tokens, without speculation (its cache is released)."""
    logits, cache = run_reference(model, cache_set, tokens, split)
    want, _ = greedy_continue(model, cache, logits, new_tokens)
    cache.release()
    return want


def split_speculative_greedy(model: V41Model, prefill_model: V41Model, cache_set: CacheSet,
                             tokens: torch.Tensor, split: SplitPlan, drafter: Drafter, new_tokens: int,
                             k: int) -> tuple[list[int], SpecRequest]:
    """P computes the prefix, D runs the window step, then decodes greedily with k drafts per step:
    the first token and the next new_tokens - 1 (D's cache is released)."""
    state = run_prefix(prefill_model, prefill_model.new_cache_set(), tokens, split)
    first, cache = run_window(model, cache_set, state, tokens, split, capture=drafter.feature_layers)
    req = start_request(drafter, cache, sample_token(first, GREEDY), model.captured, split.boundary)
    got = [req.anchor] + generate(model, drafter, req, new_tokens - 1, k)
    cache.release()
    return got, req
