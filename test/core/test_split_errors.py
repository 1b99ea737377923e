"""Bad input to the split raises a clear error and keeps nothing half-computed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_asym.asym import PrefixMismatch, run_prefix, run_window
from sglang_asym.config import V41Config
from sglang_asym.split import SplitError, SplitPlan
from harness.verify import Models, random_prompt



@pytest.fixture(scope="module")
def models():
    return Models.build(V41Config.tiny(), seed=2)


@pytest.mark.parametrize("window", [0, -3, 129, 1.5])
def test_bad_window(window):
    with pytest.raises(SplitError, match="window"):
        SplitPlan(V41Config.tiny(), 300, window)


def test_prompt_beyond_max_positions():
    cfg = V41Config.tiny()
    with pytest.raises(SplitError, match="exceeds max_position_embeddings"):
        SplitPlan(cfg, cfg.max_position_embeddings + 1, 128)
    with pytest.raises(SplitError, match="positive integer"):
        SplitPlan(cfg, 0, 128)


def test_unknown_semantics_and_unsplittable_exact(models):
    with pytest.raises(ValueError, match="unknown semantics 'fast'"):
        SplitPlan(V41Config.tiny(), 300, 128, "fast")
    split = SplitPlan(V41Config.tiny(), 300, 128, "exact")
    with pytest.raises(SplitError, match="cannot be split"):
        run_prefix(models.prefill, models.prefill.new_cache_set(), random_prompt(split.config, 300, 1), split)


def _state(models, n, window=128, semantics="asym-exact-encoder"):
    split = SplitPlan(models.full.cfg, n, window, semantics)
    tokens = random_prompt(models.full.cfg, n, 3)
    return tokens, split, run_prefix(models.prefill, models.prefill.new_cache_set(), tokens, split)


def test_prefix_state_from_another_window_or_config(models):
    tokens, split, state = _state(models, 300, window=100)
    caches = models.full.new_cache_set()
    other_window = SplitPlan(models.full.cfg, 300, 128, "asym-exact-encoder")
    with pytest.raises(PrefixMismatch, match="W=100"):
        run_window(models.full, caches, state, tokens, other_window)
    foreign = dataclasses.replace(state, config_fingerprint="0123456789abcdef")
    with pytest.raises(PrefixMismatch, match="another config"):
        run_window(models.full, caches, foreign, tokens, split)
    shorter = SplitPlan(models.full.cfg, 299, 100, "asym-exact-encoder")
    with pytest.raises(PrefixMismatch, match="N=300"):
        run_window(models.full, caches, state, tokens[:299], shorter)
    truncated = dataclasses.replace(state, rows={k: v[:-1] if not k.startswith("tail") else v
                                                 for k, v in state.rows.items()})
    with pytest.raises(PrefixMismatch, match="do not match the split manifest"):
        run_window(models.full, caches, truncated, tokens, split)
    caches.check_no_leak()  # nothing half-installed stays behind


def test_prompt_that_does_not_match_the_plan(models):
    tokens, split, state = _state(models, 300)
    with pytest.raises(ValueError, match="N=300"):
        run_window(models.full, models.full.new_cache_set(), state, tokens[:200], split)
    with pytest.raises(ValueError, match="N=300"):
        run_prefix(models.prefill, models.prefill.new_cache_set(), torch.cat((tokens, tokens)), split)


def test_model_error_mid_window_frees_the_cache(models):
    tokens, split, state = _state(models, 300)
    caches = models.full.new_cache_set()
    bad = tokens.clone()
    bad[-1] = models.full.cfg.vocab_size  # only the window part is bad: the prefix was fine
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run_window(models.full, caches, state, bad, split)
    caches.check_no_leak()
