"""Speculative decoding from the split's window step emits the plain greedy tokens of the same split.

run_prefix on the prefill-role model, run_window on the full model with the drafter's features
captured; the drafter's context then starts at B."""

from __future__ import annotations

import pytest

from model.helpers import build, prompt
from sglang_asym.asym import run_prefix, run_window
from sglang_asym.model.steps import greedy_continue
from sglang_asym.speculative import GREEDY, generate, sample_token
from sglang_asym.split import SplitPlan

from .doubles import TeacherDrafter
from .helpers import dspark, start_request, target

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def prefill_model():
    return build("tiny", 0, role="prefill")


@pytest.mark.parametrize("n, window, semantics, k", [
    (200, 128, "asym-exact-encoder", 3),
    (131, 128, "asym-exact-encoder", 5),  # odd B: a compressor tail crosses the split
    (175, 128, "asym", 1),
    (157, 64, "decoder-replay", 5),  # a window shorter than the drafter's: its context starts at B
])
# teacher: the target drafting from an exact prefill, often right, so long accepted runs occur after the window
@pytest.mark.parametrize("drafter_kind", ["dspark", "teacher"])
def test_speculative_after_window_step_equals_greedy(prefill_model, n, window, semantics, k, drafter_kind):
    model = target()
    tokens = prompt(model.cfg, n, seed=n)
    split = SplitPlan(model.cfg, n, window, semantics)
    p_caches, d_caches = prefill_model.new_cache_set(), model.new_cache_set()
    state = run_prefix(prefill_model, p_caches, tokens, split)

    first, ref_cache = run_window(model, d_caches, state, tokens, split)
    want, _ = greedy_continue(model, ref_cache, first, NEW_TOKENS)
    ref_cache.release()

    drafter = dspark() if drafter_kind == "dspark" else TeacherDrafter(model, tokens, 5)
    first, cache = run_window(model, d_caches, state, tokens, split, capture=drafter.feature_layers)
    req = start_request(drafter, cache, sample_token(first, GREEDY), model.captured, split.boundary)
    if drafter_kind == "dspark":
        assert (req.draft_state.begin, req.draft_state.end) == (split.boundary, n)
    got = [req.anchor] + generate(model, drafter, req, NEW_TOKENS - 1, k)
    assert got == want
    assert req.stats.emitted >= NEW_TOKENS - 1
    cache.release()
    d_caches.check_no_leak()
    p_caches.check_no_leak()
