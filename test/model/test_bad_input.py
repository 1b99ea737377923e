"""Bad input to the reference model raises a clear error naming the problem and changes no cache;
the model also runs in bf16."""

from __future__ import annotations

import pytest
import torch

from model.helpers import build, prompt
from sglang_asym.config import ConfigError, V41Config
from sglang_asym.model import InvalidInput, V41Model


@pytest.fixture(scope="module")
def tiny():
    model = build("tiny", seed=5)
    return model, model.new_cache_set()


def test_empty_prompt(tiny):
    model, caches = tiny
    cache = caches.new_request()
    with pytest.raises(InvalidInput, match="empty prompt"):
        model(torch.tensor([], dtype=torch.long), cache)
    assert cache.pos == 0 and not cache.groups
    cache.release()


def test_token_outside_vocabulary(tiny):
    model, caches = tiny
    cache = caches.new_request()
    with pytest.raises(InvalidInput, match="token id 512 at index 2 is outside the vocabulary"):
        model(torch.tensor([1, 2, 512]), cache)
    with pytest.raises(InvalidInput, match="token id -1"):
        model(torch.tensor([-1]), cache)
    assert cache.pos == 0 and not cache.groups
    cache.release()


def test_prompt_past_max_positions(tiny):
    model, caches = tiny
    cache = caches.new_request()
    too_long = torch.zeros(model.cfg.max_position_embeddings + 1, dtype=torch.long)
    with pytest.raises(InvalidInput, match="exceeds max_position_embeddings 8192"):
        model(too_long, cache)
    cache.release()
    caches.check_no_leak()


def test_bad_arguments(tiny):
    model, caches = tiny
    cache = caches.new_request()
    with pytest.raises(ValueError, match="logits must be"):
        model(torch.tensor([1]), cache, logits="some")
    with pytest.raises(InvalidInput, match="1-D integer tensor"):
        model(torch.tensor([[1, 2]]), cache)
    with pytest.raises(InvalidInput, match="1-D integer tensor"):
        model(torch.tensor([1.0]), cache)
    cache.release()
    with pytest.raises(RuntimeError, match="released"):
        model(torch.tensor([1]), cache)


def test_not_v41_and_missing_tensor():
    with pytest.raises(ConfigError, match="model_type 'qwen2'"):
        V41Config.from_hf_dict({"model_type": "qwen2", "hidden_size": 8})
    model = V41Model(V41Config.tiny())
    weights = {k: v for k, v in build("tiny", 5).state_dict().items() if k != "layers.7.attn.indexer.wq_b.weight"}
    with pytest.raises(KeyError, match="layers.7.attn.indexer.wq_b.weight"):
        model.load_weights(weights)
    weights["layers.7.attn.indexer.wq_b.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"layers.7.attn.indexer.wq_b.weight: shape \(3, 3\)"):
        model.load_weights(weights)


def test_engram_configs_are_refused():
    with pytest.raises(ConfigError, match="Engram"):
        V41Model(V41Config.tiny().replace(engram_layer_ids=(1,), engram_num_embeddings=(10,)))


def test_bf16_runs_and_tracks_fp32(tiny):
    model32, _ = tiny
    model16 = V41Model(model32.cfg, dtype="bfloat16")
    model16.load_weights(model32.state_dict())
    tokens = prompt(model32.cfg, 150, seed=3)
    l32 = model32(tokens, model32.new_cache_set().new_request(), logits="all")
    l16 = model16(tokens, model16.new_cache_set().new_request(), logits="all")
    assert l16.dtype == torch.float32 and torch.isfinite(l16).all()
    agree = (l16.argmax(-1) == l32.argmax(-1)).float().mean()
    assert agree > 0.85, float(agree)
    # bf16 rounding flips an occasional top-k choice, so compare typical, not worst-case, deviation
    assert float((l16 - l32).abs().mean()) < 0.05
