"""The `small` preset (the real 40-layer schedule, W = 128, 128 experts): the greedy split pipeline
with speculative decoding produces the single-process reference's tokens (without speculation) at
every prompt length of the split acceptance list but 4097. test_split_lengths.py does the same on `tiny`,
4097 included (past tiny's YaRN original length of 1024 over a prefix of many chunks, a fifth of small's cost
there).

Kept bounded for CI: a few generated tokens, and a drafter that proposes the reference continuation
with one draft corrupted per step (so every step verifies 1 + k rows, accepts a part and rolls the
rest back: at the compressor pair boundaries and the window edge of each length). The random DSpark
drafter runs at one length to cover its feature capture on this schedule."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.model.dspark import Chooser, Draft
from sglang_asym.split import SplitPlan

from .helpers import SPLIT_LENGTHS, W, random_dspark, reference_greedy, split_speculative_greedy

NEW_TOKENS = 6
K = 3
LENGTHS = tuple(n for n in SPLIT_LENGTHS if n != 4097)


@lru_cache(maxsize=None)
def models():
    return build("small", 0, cache_quant="release"), build("small", 0, role="prefill", cache_quant="release")


class CorruptedReference:
    """Proposes the reference continuation (position -> token) with draft index `bad[step % len]`
    replaced by a wrong token: accepted lengths 0 .. k all occur."""

    feature_layers: tuple[int, ...] = ()
    max_draft = 5

    def __init__(self, first_pos: int, continuation: list[int], vocab: int, bad: tuple[int, ...] = (1, 0, 2, 3)):
        self.at = {first_pos + i: t for i, t in enumerate(continuation)}
        self.vocab, self.bad, self.steps = vocab, bad, 0

    def new_state(self):
        return None

    def observe(self, state, captured, first_pos: int) -> None:
        pass

    def rollback(self, state, pos: int) -> None:
        pass

    def propose(self, state, anchor: int, pos: int, k: int, choose: Chooser) -> Draft:
        bad = self.bad[self.steps % len(self.bad)]
        self.steps += 1
        tokens = [self.at.get(pos + 1 + j, 0) for j in range(k)]
        tokens = [(t + 1) % self.vocab if j == bad else t for j, t in enumerate(tokens)]
        logits = torch.full((k, self.vocab), -30.0)
        logits[torch.arange(k), torch.tensor(tokens)] = 30.0
        return Draft(tuple(choose(row) for row in logits), logits)


@pytest.mark.parametrize("n", LENGTHS)
def test_small_split_with_speculation_equals_reference_without(n):
    model, prefill_model = models()
    tokens = prompt(model.cfg, n, seed=n + 5)
    split = SplitPlan(model.cfg, n, W, "asym-exact-encoder")
    d_caches = model.new_cache_set()
    want = reference_greedy(model, d_caches, tokens, split, NEW_TOKENS)

    drafter = CorruptedReference(n, want, model.cfg.vocab_size)
    got, req = split_speculative_greedy(model, prefill_model, d_caches, tokens, split, drafter, NEW_TOKENS, K)
    assert got == want
    assert 0 < req.stats.accepted < req.stats.proposed
    d_caches.check_no_leak()


def test_small_split_with_the_dspark_drafter():
    model, prefill_model = models()
    drafter = random_dspark(model, 1)
    n = 2 * W + 1
    tokens = prompt(model.cfg, n, seed=77)
    split = SplitPlan(model.cfg, n, W, "asym-exact-encoder")
    d_caches = model.new_cache_set()
    want = reference_greedy(model, d_caches, tokens, split, NEW_TOKENS)
    got, req = split_speculative_greedy(model, prefill_model, d_caches, tokens, split, drafter, NEW_TOKENS, K)
    assert got == want
    assert req.stats.proposed >= K
    d_caches.check_no_leak()
