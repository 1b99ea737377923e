"""The split (prefill-role instance -> payload -> decode-role instance) reproduces the single-process
reference of the same semantics: identical greedy tokens, logits within 1e-4 in fp32."""

from __future__ import annotations

import pytest
import torch

from sglang_asym.asym import run_prefix
from sglang_asym.cache import index_group, kv_group
from sglang_asym.config import V41Config
from sglang_asym.layer_plan import LayerPlan
from harness.verify import Models, random_prompt, verify

W = 128
LENGTHS = [1, 2, W - 1, W, W + 1, W + 2, 2 * W + 1, 1000, 4097]
_MODELS: dict[str, Models] = {}


def models(preset: str) -> Models:
    if preset not in _MODELS:
        _MODELS[preset] = Models.build(V41Config.preset(preset), seed=11)
    return _MODELS[preset]


# every length on `tiny` (nine layers, every layer role; 4097 is past its YaRN original length of 1024, over a
# prefix of many chunks); `small` (the 40-layer schedule: prefill layers 0-20, its ratio-2 owners' groups, encoder
# windows 0-19) at the first prefix, W + 1. Small's other lengths made the same assertions at several times tiny's
# cost each (12-26 s; 73 s at 4097).
CASES = [(n, "tiny") for n in LENGTHS] + [(W + 1, "small")]


@pytest.mark.parametrize(("n", "preset"), CASES, ids=[f"{n}-{preset}" for n, preset in CASES])
def test_split_equals_reference(preset, n):
    m = models(preset)
    prompt = random_prompt(m.full.cfg, n, seed=5)
    short = n <= W
    for semantics in ("asym-exact-encoder", "asym"):
        result = verify(m, prompt, W, semantics, new_tokens=16, with_exact=short)
        assert result["split_tokens"] == result["reference_tokens"], semantics
        assert len(result["split_tokens"]) == 16
        assert result["max_abs_logit_diff"] <= 1e-4, semantics
        if short:
            # N <= W: the prefill role runs no layer, nothing crosses, and the result is exact
            assert result["prefill_layers_run"] == []
            assert result["payload_bytes"] == 0 and result["payload_groups"] == {}
            assert result["kl_vs_exact"] == 0.0
        else:
            plan = LayerPlan.from_config(m.full.cfg)
            assert result["prefill_layers_run"] == list(range(plan.last_kv_source + 1))
            b = n - W
            groups = result["payload_groups"]
            for owner in plan.ratio2_owners:
                assert groups[kv_group(owner)] == groups[index_group(owner)] == b // 2
                assert groups.get(f"tail.L{owner}", 0) == b % 2
            assert groups[kv_group(plan.last_kv_source)] == b
            encoder_swa = {k: v for k, v in groups.items() if k.startswith("swa.")}
            if semantics == "asym":
                assert encoder_swa == {}
            else:
                assert encoder_swa == {f"swa.L{i}": min(b, W - 1) for i in plan.encoder_layers}


def test_prefill_instance_holds_only_its_tensors():
    m = models("tiny")
    plan = LayerPlan.from_config(m.full.cfg)
    held = set(m.prefill.state_dict())
    assert held == set(plan.prefill_tensor_names)
    last = plan.last_kv_source
    assert sorted(n for n in held if n.startswith(f"layers.{last}.")) == [
        f"layers.{last}.attn.compressor.norm.weight",
        f"layers.{last}.attn.compressor.wkv.weight",
        f"layers.{last}.attn.indexer.k_norm.weight",
        f"layers.{last}.attn.indexer.wk.weight",
        f"layers.{last}.attn_norm.weight",
    ]
    assert not any(n.startswith(f"layers.{i}.") for n in held for i in range(last + 1, m.full.cfg.num_hidden_layers))
    assert "head.weight" not in held and "norm.weight" not in held
    assert "embed.weight" in held


@pytest.mark.parametrize("n", [301, 302])
def test_last_kv_source_rows_bit_identical_to_full_model(n):
    m = models("tiny")
    prompt = random_prompt(m.full.cfg, n, seed=9)
    last = m.full.plan.last_kv_source
    p_cache = m.prefill.new_cache_set().new_request()
    f_cache = m.full.new_cache_set().new_request()
    m.prefill(prompt, p_cache)
    m.full(prompt, f_cache, logits="none")
    for group in (kv_group(last), index_group(last)):
        assert torch.equal(p_cache.rows(group).read(), f_cache.rows(group).read())
        assert len(p_cache.rows(group)) == n


def test_prefill_role_state_has_only_manifest_rows():
    m = models("tiny")
    from sglang_asym.split import SplitPlan

    prompt = random_prompt(m.full.cfg, 301, seed=1)
    split = SplitPlan(m.full.cfg, 301, W, "asym-exact-encoder")
    state = run_prefix(m.prefill, m.prefill.new_cache_set(), prompt, split)
    manifest = split.manifest("model")
    assert set(state.rows) == {g.name for g in manifest.groups}
    assert state.nbytes() == manifest.total_bytes
