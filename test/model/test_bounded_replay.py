"""Bounded replay (SGLang's symmetric default) in one process equals the asymmetric split with the exact-encoder
handoff, token for token, and runs the layers from the last KV source on only the last W rows."""

from __future__ import annotations

import pytest

from sglang_asym.asym import run_prefix, run_window
from sglang_asym.bounded_replay import bounded_replay_split, run_bounded_replay
from sglang_asym.cache import CacheSizing, kv_group, swa_group
from sglang_asym.model.steps import greedy_continue
from sglang_asym.split import SplitPlan

from .helpers import build, prompt

W = 128
NEW_TOKENS = 8
SIZING = CacheSizing(max_requests=2, max_tokens=1100)


@pytest.fixture(scope="module")
def models():
    return build("tiny", 0), build("tiny", 0, role="prefill")


@pytest.mark.parametrize("n", [1, W - 1, W, W + 1, 300, 1000])
def test_bounded_replay_greedy_equals_asym_exact_encoder(models, n):
    model, prefill_model = models
    tokens = prompt(model.cfg, n, seed=n)
    split = SplitPlan(model.cfg, n, W, "asym-exact-encoder")
    p_caches, d_caches = prefill_model.new_cache_set(SIZING), model.new_cache_set(SIZING)
    state = run_prefix(prefill_model, p_caches, tokens, split)
    first, cache = run_window(model, d_caches, state, tokens, split)
    want, _ = greedy_continue(model, cache, first, NEW_TOKENS)
    cache.release()

    first, cache = run_bounded_replay(model, d_caches, tokens, W)
    last = model.plan.last_kv_source
    b = split.boundary
    # layers from the last KV source on hold window rows only from B; the KV source's compressed rows cover [0, N)
    assert cache.rows(swa_group(last)).start == (b if b else 0)
    assert cache.rows(swa_group(model.cfg.num_hidden_layers - 1)).start == (b if b else 0)
    assert cache.rows(kv_group(last)).end == n // model.cfg.compress_ratios[last]
    if b:
        assert cache.rows(swa_group(last - 1)).start < b  # the layers before it computed the prefix rows
    got, _ = greedy_continue(model, cache, first, NEW_TOKENS)
    cache.release()
    assert got == want
    d_caches.check_no_leak()
    p_caches.check_no_leak()


def test_prefix_pass_runs_only_up_to_the_last_kv_source(models):
    model, _ = models
    tokens = prompt(model.cfg, 300, seed=3)
    caches = model.new_cache_set(SIZING)
    cache = caches.new_request()
    model.forward_to_kv_source(tokens[:172], cache)
    assert model.layers_run == tuple(range(model.plan.last_kv_source + 1))
    assert cache.pos == 172
    assert bounded_replay_split(model, 300, W).boundary == 172
    cache.release()
    cache = caches.new_request()
    model(tokens[:10], cache, logits="none")  # the late layers hold window rows: a prefix pass cannot drop them
    with pytest.raises(RuntimeError, match="already holds rows"):
        model.forward_to_kv_source(tokens[10:20], cache)
    assert cache.pos == 10  # refused before any layer ran
    cache.release()
    caches.check_no_leak()


def test_prefill_role_model_is_refused(models):
    _, prefill_model = models
    with pytest.raises(ValueError, match="full model"):
        run_bounded_replay(prefill_model, prefill_model.new_cache_set(SIZING), prompt(prefill_model.cfg, 10), W)
