"""The greedy split pipeline with speculative decode produces the single-process reference's tokens
(without speculation) at every prompt length of the split acceptance list."""

from __future__ import annotations

import pytest

from model.helpers import build, prompt
from sglang_asym.split import SplitPlan

from .helpers import SPLIT_LENGTHS, W, dspark, reference_greedy, split_speculative_greedy, target

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def prefill_model():
    return build("tiny", 0, role="prefill")


@pytest.mark.parametrize("n", SPLIT_LENGTHS)
def test_split_with_speculation_equals_reference_without(prefill_model, n):
    model, drafter = target(), dspark()
    tokens = prompt(model.cfg, n, seed=n + 3)
    split = SplitPlan(model.cfg, n, W, "asym-exact-encoder")
    d_caches = model.new_cache_set()
    want = reference_greedy(model, d_caches, tokens, split, NEW_TOKENS)
    got, _ = split_speculative_greedy(model, prefill_model, d_caches, tokens, split, drafter, NEW_TOKENS, 3)
    assert got == want
    d_caches.check_no_leak()
