"""Rolling a request back over a rejected speculative suffix leaves exactly the cache that only ever
saw the accepted tokens (window rows, compressed rows, index keys and compressor tails)."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt


@pytest.fixture(scope="module")
def tiny():
    model = build("tiny", seed=2)
    return model, model.new_cache_set()


@pytest.mark.parametrize("n", [140, 141])  # even and odd prefix: tails before and after the verify step
@pytest.mark.parametrize("accepted", range(0, 7))
def test_truncate_then_continue_equals_never_seen(tiny, n, accepted):
    model, cache_set = tiny
    tokens = prompt(model.cfg, n + 10, seed=n)
    speculative = cache_set.new_request()
    model(tokens[:n], speculative, logits="none")
    drafted = torch.randint(0, model.cfg.vocab_size, (7,), generator=torch.Generator().manual_seed(accepted))
    model(drafted, speculative, logits="all")  # verify step over 7 tokens
    speculative.truncate(n + accepted)
    kept = torch.cat((tokens[:n], drafted[:accepted]))
    follow = tokens[n : n + 3]
    got = model(follow, speculative, logits="all")

    clean = cache_set.new_request()
    model(kept, clean, logits="none")
    want = model(follow, clean, logits="all")
    assert float((got - want).abs().max()) <= 1e-5
    for name, rows in clean.groups.items():
        assert speculative.groups[name].end == rows.end, name
    speculative.release()
    clean.release()
    cache_set.check_no_leak()


def test_truncate_refuses_the_future_and_the_forgotten(tiny):
    model, cache_set = tiny
    cache = cache_set.new_request()
    model(prompt(model.cfg, 60), cache, logits="none")
    with pytest.raises(ValueError, match="holds 60 tokens"):
        cache.truncate(61)
    with pytest.raises(ValueError, match="no longer kept"):
        cache.truncate(21)
    cache.release()
