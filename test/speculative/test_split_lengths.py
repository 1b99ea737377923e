"""The greedy split pipeline with speculative decode produces the single-process reference's tokens
(without speculation) at every prompt length of the split acceptance list."""

from __future__ import annotations

import pytest

from model.helpers import build, prompt
from sglang_asym.asym import run_prefix, run_reference, run_window
from sglang_asym.cache import CacheSizing
from sglang_asym.model.steps import greedy_continue
from sglang_asym.speculative import GREEDY, generate, sample_token, start_request
from sglang_asym.split import SplitPlan

from .helpers import dspark, target

W = 128
NEW_TOKENS = 16
SIZING = CacheSizing(max_requests=2, max_tokens=4097 + NEW_TOKENS + 8)


@pytest.fixture(scope="module")
def prefill_model():
    return build("tiny", 0, role="prefill")


@pytest.mark.parametrize("n", [1, 2, W - 1, W, W + 1, W + 2, 2 * W + 1, 1000, 4097])
def test_split_with_speculation_equals_reference_without(prefill_model, n):
    model, drafter = target(), dspark()
    tokens = prompt(model.cfg, n, seed=n + 3)
    split = SplitPlan(model.cfg, n, W, "asym-exact-encoder")
    d_caches = model.new_cache_set(SIZING)
    ref_logits, ref_cache = run_reference(model, d_caches, tokens, split)
    want, _ = greedy_continue(model, ref_cache, ref_logits, NEW_TOKENS)
    ref_cache.release()

    state = run_prefix(prefill_model, prefill_model.new_cache_set(SIZING), tokens, split)
    first, cache = run_window(model, d_caches, state, tokens, split, capture=drafter.feature_layers)
    req = start_request(drafter, cache, sample_token(first, GREEDY), model.captured, split.boundary)
    got = [req.anchor] + generate(model, drafter, req, NEW_TOKENS - 1, 3)
    cache.release()
    assert got == want
    d_caches.check_no_leak()
