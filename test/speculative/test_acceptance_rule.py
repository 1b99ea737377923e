"""Acceptance rules on explicit distributions: greedy prefix matching and exact speculative sampling.

The sampling rule's emitted tokens must be distributed exactly as the target's p (checked statistically)."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_asym.speculative import Sampling, accept_greedy, accept_sampled, sample_token, token_probs

P = torch.tensor([[0.10, 0.40, 0.20, 0.25, 0.05],   # target at draft index 0
                  [0.30, 0.05, 0.05, 0.30, 0.30],   # index 1
                  [0.05, 0.15, 0.50, 0.20, 0.10]],  # bonus row
                 dtype=torch.float64)
Q = torch.tensor([[0.30, 0.10, 0.30, 0.10, 0.20],
                  [0.05, 0.50, 0.25, 0.00, 0.20]], dtype=torch.float64)
TRIALS = 20000


def assert_distribution(counts: torch.Tensor, expected: torch.Tensor) -> None:
    """Every cell within 5 standard deviations of a multinomial sample of this size."""
    n = int(counts.sum())
    assert n > 1000
    sigma = (expected * (1 - expected) / n).sqrt()
    freq = counts.double() / n
    assert bool(((freq - expected).abs() <= 5 * sigma + 1e-12).all()), (freq.tolist(), expected.tolist())


def run_trials(p: torch.Tensor, q: torch.Tensor, trials: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=gen) for i in range(q.shape[0])], 1)
    return [accept_sampled(d.tolist(), q, p, gen) for d in drafts]


def test_sampled_tokens_follow_the_target_distribution():
    results = run_trials(P, Q, TRIALS, seed=0)
    first = torch.bincount(torch.tensor([r[0] for r in results]), minlength=5)
    assert_distribution(first, P[0])
    second = torch.bincount(torch.tensor([r[1] for r in results if len(r) >= 2]), minlength=5)
    assert_distribution(second, P[1])  # after an accepted first draft: p_1, whatever was drafted
    bonus = torch.bincount(torch.tensor([r[2] for r in results if len(r) == 3]), minlength=5)
    assert_distribution(bonus, P[2])
    # the first draft is accepted with probability sum_x min(p(x), q(x)) = 0.6
    accepted = sum(len(r) >= 2 for r in results)
    expected = float(torch.minimum(P[0], Q[0]).sum())
    assert abs(accepted / TRIALS - expected) <= 5 * math.sqrt(expected * (1 - expected) / TRIALS)


def test_wrong_rule_would_be_caught():
    """The check above has power: emitting the draft unconditionally gives q, far outside the tolerance."""
    gen = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(Q[0], TRIALS, replacement=True, generator=gen)
    with pytest.raises(AssertionError):
        assert_distribution(torch.bincount(drafts, minlength=5), P[0])


def test_draft_equal_to_target_is_always_accepted():
    p = P.clone()
    results = run_trials(p, p[:2].clone(), 2000, seed=2)
    assert all(len(r) == 3 for r in results)
    assert_distribution(torch.bincount(torch.tensor([r[2] for r in results]), minlength=5), P[2])


def test_draft_outside_the_target_support_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5], [1 / 3] * 3], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    outs = [accept_sampled([0], q, p, gen) for _ in range(500)]
    assert all(len(o) == 1 and o[0] in (1, 2) for o in outs)


def test_greedy_prefix_then_target_token():
    rows = torch.zeros(4, 10)
    for i, best in enumerate([3, 4, 9, 1]):
        rows[i, best] = 1.0
    assert accept_greedy([3, 4, 5], rows) == [3, 4, 9]
    assert accept_greedy([3, 4, 9], rows) == [3, 4, 9, 1]
    assert accept_greedy([7, 4, 9], rows) == [3]
    assert accept_greedy([], rows[:1]) == [3]


def test_rule_inputs_are_checked():
    with pytest.raises(ValueError, match="one row per verified token"):
        accept_greedy([1, 2], torch.zeros(2, 5))
    with pytest.raises(ValueError, match="draft_probs must be"):
        accept_sampled([1, 2], Q[:1], P)
    with pytest.raises(ValueError, match="probability 0"):
        accept_sampled([3, 0], Q[[1, 1]], P)


def test_token_probs_exact_values():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    assert torch.allclose(token_probs(logits, Sampling(temperature=1.0)), torch.tensor([0.6, 0.3, 0.1]).double())
    assert torch.allclose(token_probs(logits, Sampling(temperature=1.0, top_k=2)),
                          torch.tensor([2 / 3, 1 / 3, 0.0]).double())
    assert torch.equal(token_probs(logits, Sampling(temperature=1.0, top_p=0.5)), torch.tensor([1.0, 0, 0]).double())
    assert torch.allclose(token_probs(logits, Sampling(temperature=1.0, top_p=0.7)),
                          torch.tensor([2 / 3, 1 / 3, 0.0]).double())
    assert torch.allclose(token_probs(logits, Sampling(temperature=0.5)), torch.tensor([36, 9, 1]).double() / 46)
    assert torch.equal(token_probs(logits, Sampling()), torch.tensor([1.0, 0, 0]).double())
    tie = torch.tensor([0.0, 2.0, 2.0])
    assert sample_token(tie, Sampling()) == 1 and sample_token(tie, Sampling(temperature=1.0, top_k=1)) == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": True}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_k": 2.0}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
])
def test_bad_sampling_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)
