"""Greedy speculative decoding emits exactly the plain greedy tokens, whatever the drafter proposes.

Drafters: random DSpark weights, a constant (wrong) drafter, and the target itself with one draft
corrupted per step (every accepted length 0 .. k occurs, so every rollback length is exercised)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from model.helpers import prompt
from sglang_asym.model.steps import greedy_continue
from sglang_asym.speculative import GREEDY, SpecRequest, generate, prefill_for_drafting, sample_token, speculative_step

from .doubles import ConstantDrafter, TeacherDrafter
from .helpers import dspark, target

NEW_TOKENS = 12
LENGTHS = [1, 64, 129, 203]  # a single token, below the window, odd and even past it


@lru_cache(maxsize=None)
def reference(n: int) -> tuple[int, ...]:
    model = target()
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    tokens, _ = greedy_continue(model, cache, model(prompt(model.cfg, n, seed=n), cache), NEW_TOKENS)
    cache.release()
    return tuple(tokens)


def speculative(n: int, k: int, make_drafter, chunk: int | None = None) -> tuple[list[int], SpecRequest]:
    model = target()
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    drafter = make_drafter(model, cache)
    logits, state = prefill_for_drafting(model, drafter, cache, prompt(model.cfg, n, seed=n), chunk=chunk)
    req = SpecRequest(cache, state, sample_token(logits, GREEDY))
    out = [req.anchor] + generate(model, drafter, req, NEW_TOKENS - 1, k)
    assert req.stats.emitted >= NEW_TOKENS - 1 and req.stats.proposed >= req.stats.accepted
    cache.release()
    cache_set.check_no_leak()
    return out, req


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("n", LENGTHS)
def test_random_dspark_drafter(n, k):
    out, req = speculative(n, k, lambda model, cache: dspark())
    assert out == list(reference(n))
    assert req.stats.steps == req.stats.emitted - req.stats.accepted


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("n", LENGTHS)
def test_constant_wrong_drafter(n, k):
    out, _ = speculative(n, k, lambda model, cache: ConstantDrafter(7, model.cfg.vocab_size, 5))
    assert out == list(reference(n))


def test_chunked_prefill_feeds_the_drafter():
    out, _ = speculative(203, 3, lambda model, cache: dspark(), chunk=50)
    assert out == list(reference(203))


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("n", [129, 203])
def test_every_accepted_length_rolls_back_exactly(n, k):
    model = target()
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    corrupt = tuple(range(k + 1))  # step s corrupts draft s % (k + 1); k means none
    tokens = prompt(model.cfg, n, seed=n)
    drafter = TeacherDrafter(model, tokens, 5, corrupt_at=corrupt)
    logits, state = prefill_for_drafting(model, drafter, cache, tokens)
    req = SpecRequest(cache, state, sample_token(logits, GREEDY))
    out, step = [req.anchor], 0
    while len(out) < NEW_TOKENS:
        emitted = speculative_step(model, drafter, req, k)
        assert len(emitted) == corrupt[step % len(corrupt)] + 1  # drafts before the corrupted one are right
        out += emitted
        step += 1
    assert out[:NEW_TOKENS] == list(reference(n))
    used = [corrupt[s % len(corrupt)] for s in range(step)]
    assert req.stats.accepted_at == [sum(c > i for c in used) for i in range(k)]
    assert req.stats.proposed_at == [step] * k
    cache.release()
    cache_set.check_no_leak()
