"""Write -> read round trips at every precision, single-file and sharded, and random_weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from sglang_asym.checkpoint import (
    CheckpointReader,
    encode_for_disk,
    load_weights,
    random_tensor,
    random_weights,
    write_checkpoint,
)
from sglang_asym.checkpoint import formats
from sglang_asym.checkpoint.specs import checkpoint_tensor_specs
from sglang_asym.config import V41Config
from sglang_asym.layer_plan import LayerPlan
from sglang_asym.tensor_specs import backbone_tensor_specs

from .ckpt_testlib import SEED



def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("precision", ["release", "bf16", "fp32"])
def test_single_file_round_trip_equals_random_weights(tmp_path, tiny_cfg, precision):
    write_checkpoint(tmp_path, tiny_cfg, SEED, precision=precision, num_shards=1, progress=False)
    assert not (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_weights(tmp_path, progress=False)
    assert_same_tensors(loaded, random_weights(tiny_cfg, SEED, precision=precision))
    assert all(t.dtype == torch.float32 for t in loaded.values())


def test_sharded_release_round_trip(tiny_release_sharded, tiny_cfg):
    reader = CheckpointReader(tiny_release_sharded)
    loaded, stats = reader.load(progress=False), reader.stats
    assert_same_tensors(loaded, random_weights(tiny_cfg, SEED, precision="release"))
    specs = backbone_tensor_specs(tiny_cfg)
    quantized = [s for s in specs if s.kind in ("fp8", "fp4")]
    assert stats.tensors_requested == len(specs)
    assert stats.tensors_read == len(specs) + len(quantized)  # every fp8/fp4 weight reads its scale
    assert stats.shards_total == 5 and len(stats.shards_opened) == 4  # not the mtp.* shard


def test_release_files_hold_the_quantized_bytes(tiny_release_sharded, tiny_cfg):
    """The stored int8/fp8 payload and scales are exactly quantize(random_tensor)."""
    index = json.loads((tiny_release_sharded / "model.safetensors.index.json").read_text())["weight_map"]
    specs = {s.name: s for s in backbone_tensor_specs(tiny_cfg)}
    for name in ("layers.2.ffn.experts.3.w2.weight", "layers.5.attn.wo_a.weight", "layers.0.ffn.shared_experts.w1.weight"):
        expected = encode_for_disk(specs[name], random_tensor(specs[name], tiny_cfg, SEED), "release")
        for stored_name, tensor in expected.items():
            with safe_open(str(tiny_release_sharded / index[stored_name]), framework="pt") as f:
                on_disk = f.get_tensor(stored_name)
            assert on_disk.dtype == tensor.dtype and torch.equal(on_disk.view(torch.uint8), tensor.view(torch.uint8))
    # and decoding those bytes gives the loader's values
    w = "layers.2.ffn.experts.3.w2.weight"
    with safe_open(str(tiny_release_sharded / index[w]), framework="pt") as f:
        decoded = formats.dequantize_fp4(f.get_tensor(w), f.get_tensor(w.replace(".weight", ".scale")))
    assert torch.equal(decoded, load_weights(tiny_release_sharded, [w], progress=False)[w])


def test_bf16_output_dtype(tiny_release_sharded, tiny_cfg):
    loaded = load_weights(tiny_release_sharded, ["layers.1.attn.wq_a.weight", "head.weight"], torch.bfloat16, progress=False)
    expected = random_weights(tiny_cfg, SEED, precision="release", names=loaded.keys())
    for name, tensor in loaded.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, expected[name].to(torch.bfloat16))


def test_roles_select_layer_plan_tensors(tiny_release_sharded, tiny_cfg):
    plan = LayerPlan.from_config(tiny_cfg)
    reader = CheckpointReader(tiny_release_sharded)
    prefill = reader.load(role="prefill", progress=False)
    assert set(prefill) == plan.prefill_tensor_names
    decode = reader.load(role="decode", progress=False)
    assert set(decode) == set(plan.all_tensor_names)
    assert reader.stats is not None and reader.stats.role == "decode"


def test_random_weights_are_deterministic_and_per_tensor(tiny_cfg):
    a = random_weights(tiny_cfg, 5)
    b = random_weights(tiny_cfg, 5, names=["layers.3.attn.wkv.weight"])
    assert torch.equal(a["layers.3.attn.wkv.weight"], b["layers.3.attn.wkv.weight"])  # independent of the subset
    c = random_weights(tiny_cfg, 6)
    assert not torch.equal(a["layers.3.attn.wkv.weight"], c["layers.3.attn.wkv.weight"])
    with pytest.raises(ValueError, match="not tensors of this config"):
        random_weights(tiny_cfg, 5, names=["layers.99.attn.wkv.weight"])


def test_random_weight_scales_keep_activations_order_one():
    cfg = V41Config.small()
    w = random_weights(cfg, 0, include_extras=True, names=[
        "embed.weight", "layers.4.attn_norm.weight", "layers.4.hc_attn_base", "layers.4.hc_attn_scale",
        "layers.4.attn.wq_a.weight", "layers.4.attn.wo_b.weight", "layers.4.ffn.gate.bias", "layers.4.ffn.gate.bias_vl",
        "layers.4.attn.attn_sink", "head.weight", "mtp.2.markov_head.embed.weight",
    ])
    assert abs(w["embed.weight"].std().item() - 1.0) < 0.02
    assert abs(w["layers.4.attn_norm.weight"].mean().item() - 1.0) < 0.02
    assert torch.equal(w["layers.4.hc_attn_base"], torch.zeros(24))
    assert torch.equal(w["layers.4.hc_attn_scale"], torch.ones(3))
    assert torch.equal(w["layers.4.ffn.gate.bias_vl"], torch.zeros(cfg.n_routed_experts))
    assert w["layers.4.ffn.gate.bias"].abs().max().item() < 0.05
    assert w["layers.4.attn.attn_sink"].abs().max().item() < 0.5
    # unit-variance input through a fan-in-scaled projection stays O(1)
    x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    assert 0.8 < (x @ w["layers.4.attn.wq_a.weight"].T).std().item() < 1.2
    assert 0.8 < (x @ w["head.weight"].T).std().item() < 1.2
    # residual writers are damped by sqrt(num_layers)
    ratio = w["layers.4.attn.wo_b.weight"].std().item() * (cfg.o_groups * cfg.o_lora_rank) ** 0.5
    assert abs(ratio - cfg.num_hidden_layers ** -0.5) < 0.01


def test_every_checkpoint_tensor_has_an_init_rule():
    cfg = V41Config.small().replace(engram_layer_ids=(1,), engram_num_embeddings=(64,))
    specs = checkpoint_tensor_specs(cfg)
    assert any(".engram." in s.name for s in specs) and any(s.name.startswith("mtp.") for s in specs)
    seen_kinds = set()
    for spec in specs:
        if ".experts." in spec.name and ".experts.0." not in spec.name:
            continue
        value = random_tensor(spec, cfg, 0)
        assert value.shape == spec.shape and value.dtype == torch.float32 and bool(torch.isfinite(value).all())
        seen_kinds.add(spec.kind)
    assert seen_kinds == {"fp8", "fp4", "fp8_rows", "bf16", "fp32"}


def test_engram_and_dspark_tensors_round_trip(tmp_path):
    cfg = V41Config.tiny().replace(engram_layer_ids=(1,), engram_num_embeddings=(96,))
    assert cfg.num_nextn_predict_layers > 0
    write_checkpoint(tmp_path, cfg, SEED, num_shards=5, progress=False)
    names = [s.name for s in checkpoint_tensor_specs(cfg) if ".engram." in s.name or s.name.startswith("mtp.")]
    loaded = load_weights(tmp_path, names, progress=False)
    assert_same_tensors(loaded, random_weights(cfg, SEED, precision="release", names=names, include_extras=True))
