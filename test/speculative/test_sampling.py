"""Speculative sampling end to end: q == p accepts every draft; DSpark sampling is seeded and counted."""

from __future__ import annotations

import pytest
import torch

from model.helpers import prompt
from sglang_asym.speculative import Sampling, SpecRequest, generate, prefill_for_drafting, sample_token

from .doubles import TeacherDrafter
from .helpers import dspark, target


def run(make_drafter, sampling: Sampling, seed: int, n: int = 40, new_tokens: int = 16, k: int = 3):
    model = target()
    tokens = prompt(model.cfg, n, seed=n)
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    drafter = make_drafter(model, tokens)
    gen = torch.Generator().manual_seed(seed)
    logits, state = prefill_for_drafting(model, drafter, cache, tokens)
    req = SpecRequest(cache, state, sample_token(logits, sampling, gen))
    out = [req.anchor] + generate(model, drafter, req, new_tokens - 1, k, sampling, gen)
    cache.release()
    cache_set.check_no_leak()
    return out, req.stats


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0), Sampling(temperature=0.8, top_k=50, top_p=0.9)])
def test_drafter_equal_to_target_has_every_draft_accepted(sampling):
    out, stats = run(lambda model, tokens: TeacherDrafter(model, tokens, 5), sampling, seed=5)
    assert len(out) == 16
    assert stats.proposed > 0 and stats.accepted == stats.proposed
    assert stats.emitted == stats.accepted + stats.steps


def test_dspark_sampling_is_reproducible_and_counted():
    sampling = Sampling(temperature=1.0)
    a, stats = run(lambda model, tokens: dspark(), sampling, seed=9)
    b, _ = run(lambda model, tokens: dspark(), sampling, seed=9)
    c, _ = run(lambda model, tokens: dspark(), sampling, seed=10)
    assert a == b and a != c
    assert len(a) == 16 and all(0 <= t < 512 for t in a)
    assert stats.emitted == stats.accepted + stats.steps and stats.proposed == sum(stats.proposed_at)
