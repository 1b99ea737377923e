"""Chunked prefill at every boundary (mid-pair included) and incremental decode equal one-shot
prefill, in fp32 with cache quantization off."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.model import decode_step, prefill

N = 140  # crosses the 128-token window and has an odd tail


@pytest.fixture(scope="module")
def tiny():
    model = build("tiny", seed=1)
    tokens = prompt(model.cfg, N, seed=7)
    cache_set = model.new_cache_set()
    cache = cache_set.new_request()
    one_shot = model(tokens, cache, logits="all")
    cache.release()
    return model, cache_set, tokens, one_shot


def test_two_chunks_at_every_boundary(tiny):
    model, cache_set, tokens, one_shot = tiny
    for b in range(1, N):
        cache = cache_set.new_request()
        first = model(tokens[:b], cache, logits="all")
        second = model(tokens[b:], cache, logits="all")
        cache.release()
        got = torch.cat((first, second))
        assert float((got - one_shot).abs().max()) <= 1e-5, f"boundary {b}"
    cache_set.check_no_leak()


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 129])
def test_fixed_chunks(tiny, chunk):
    model, cache_set, tokens, one_shot = tiny
    cache = cache_set.new_request()
    got = prefill(model, cache, tokens, chunk=chunk, logits="all")
    cache.release()
    assert float((got - one_shot).abs().max()) <= 1e-5


def test_incremental_decode_equals_one_shot(tiny):
    model, cache_set, tokens, one_shot = tiny
    cache = cache_set.new_request()
    model(tokens[:100], cache, logits="none")
    steps = [decode_step(model, cache, tokens[i : i + 1])[0] for i in range(100, N)]
    cache.release()
    assert float((torch.stack(steps) - one_shot[100:]).abs().max()) <= 1e-5
    cache_set.check_no_leak()
