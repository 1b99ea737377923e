"""A full prompt's state (symmetric PD's payload) survives extract -> wire rows -> install exactly:
the installed cache decodes bit-identical logits, the wire bytes are the symmetric manifest's, the
aux rows carry the first token and the RNG stream, and a wrong state is refused by name."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.cache import CacheSizing
from sglang_asym.runtime.engine.full_prefill import prefill_prompt, sample_first
from sglang_asym.runtime.engine.request_state import (FIRST_TOKEN, RNG_STATE, RNG_STATE_BYTES, StateMismatch,
                                                      aux_rows, cache_bytes, decode_state_rows, encode_state_rows,
                                                      extract_state, install_state, restore_generator,
                                                      state_compat, state_manifest)
from sglang_asym.runtime.engine.sampler import sample
from sglang_asym.runtime.engine_api import SamplingParams
from sglang_asym.split import SplitPlan

W = 128


@pytest.fixture(scope="module")
def models():
    return {quant: build("tiny", seed=4, cache_quant=quant) for quant in ("release", "v4")}


@pytest.fixture(scope="module")
def model(models):
    return models["release"]


@pytest.mark.parametrize("n", [1, 2, W, W + 1, 300])
@pytest.mark.parametrize("row_format", ["release", "model", "v4"])
def test_installed_state_decodes_exactly_like_the_original_cache(models, n, row_format):
    """`v4` rows carry the caches of a model at `--cache-quant v4` (SGLang's V4 layout), the others a
    release-format model's."""
    model = models["v4" if row_format == "v4" else "release"]
    cfg, split = model.cfg, SplitPlan(model.cfg, n, W, "exact")
    caches = model.new_cache_set(CacheSizing(2, 1024, 64))
    original = caches.new_request()
    logits = prefill_prompt(model, original, prompt(cfg, n, seed=n), chunk=64)
    manifest = state_manifest(split, row_format, model.dtype, sampled=False)
    wire = {g: encode_state_rows(g, rows, row_format, cfg) for g, rows in extract_state(original, manifest).items()}
    assert {g: a.shape[0] for g, a in wire.items()} == {g.name: g.num_rows for g in manifest.groups
                                                         if g.name != FIRST_TOKEN}
    assert sum(a.nbytes for a in wire.values()) == cache_bytes(manifest) == manifest.total_bytes - 8
    if row_format == "release":
        assert cache_bytes(manifest) == split.symmetric_manifest().total_bytes
    rows = {g: decode_state_rows(g, a, row_format, cfg, model.dtype) for g, a in wire.items()}
    installed = install_state(model, caches, rows, n)
    assert installed.pos == original.pos == n
    token = int(torch.argmax(logits))
    for _ in range(4):
        a = model(torch.tensor([token]), original, logits="last")
        b = model(torch.tensor([token]), installed, logits="last")
        assert torch.equal(a, b)
        token = int(torch.argmax(a))
    original.release()
    installed.release()
    caches.check_no_leak()


def test_aux_rows_carry_the_first_token_and_continue_the_rng_stream(model):
    logits = torch.randn(model.cfg.vocab_size, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.9, seed=5)
    token, generator = sample_first(logits, params, fallback_seed=0)
    wire = {g: encode_state_rows(g, t, "release", model.cfg) for g, t in aux_rows(token, generator).items()}
    assert wire[FIRST_TOKEN].shape == (1, 8) and wire[RNG_STATE].shape == (1, RNG_STATE_BYTES)
    back = {g: decode_state_rows(g, a, "release", model.cfg, model.dtype) for g, a in wire.items()}
    assert int(back[FIRST_TOKEN][0]) == token
    restored = restore_generator(back)
    assert [sample(logits, params, restored) for _ in range(5)] == [sample(logits, params, generator) for _ in range(5)]
    greedy_token, none = sample_first(logits, SamplingParams(temperature=0), fallback_seed=0)
    assert none is None and greedy_token == int(torch.argmax(logits))
    assert restore_generator({FIRST_TOKEN: back[FIRST_TOKEN]}) is None


@pytest.mark.parametrize("n", [1, 2, 127, 128, 129, 1000])
def test_compat_covers_every_manifest_the_workers_can_ship(model, n):
    split = SplitPlan(model.cfg, n, W, "exact")
    for row_format in ("release", "model", "v4"):
        compat = state_compat(model.cfg, W, row_format, model.dtype)
        for sampled in (False, True):
            compat.check_manifest(state_manifest(split, row_format, model.dtype, sampled))
    assert compat.semantics == "exact"


def test_a_state_that_does_not_match_its_prompt_is_refused_by_group(model):
    caches = model.new_cache_set(CacheSizing(2, 1024, 64))
    cache = caches.new_request()
    prefill_prompt(model, cache, prompt(model.cfg, 129), chunk=64)
    rows = extract_state(cache, state_manifest(SplitPlan(model.cfg, 129, W, "exact"), "model", model.dtype, False))
    cache.release()
    with pytest.raises(StateMismatch, match=r"missing \['tail.L1'\]"):
        install_state(model, caches, {k: v for k, v in rows.items() if k != "tail.L1"}, 129)
    with pytest.raises(StateMismatch, match="wrong row counts"):
        install_state(model, caches, rows, 131)
    caches.check_no_leak()
