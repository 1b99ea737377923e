"""V41Config: HF config.json in and out, presets, validation with clear errors; LayerPlan roles."""

from __future__ import annotations

import json

import pytest

from sglang_asym.config import ConfigError, V41Config
from sglang_asym.layer_plan import LayerPlan, Role


@pytest.mark.parametrize("preset", ["tiny", "small", "sglang-small", "sglang-tiny", "flash"])
def test_round_trip_through_config_json(tmp_path, preset):
    cfg = V41Config.preset(preset)
    path = cfg.write_json(tmp_path)
    raw = json.loads(path.read_text())
    assert raw["model_type"] == "deepseek_v41"
    assert raw["architectures"] == ["DeepseekV41ForCausalLM"]
    assert raw["text_config"]["compress_ratios"] == list(cfg.compress_ratios)
    assert V41Config.from_json_file(tmp_path) == cfg


def test_flat_layout_and_unknown_keys_survive():
    raw = V41Config.tiny().to_hf_dict()
    flat = dict(raw["text_config"], quantization_config={"fmt": "e4m3"}, vision_config={"num_hidden_layers": 0})
    cfg = V41Config.from_hf_dict(flat)
    assert cfg == V41Config.tiny()
    again = cfg.to_hf_dict()
    assert again["text_config"]["quantization_config"] == {"fmt": "e4m3"}


def test_flash_is_the_released_shape():
    cfg = V41Config.flash()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (129280, 5120, 40, 64)
    assert cfg.compress_ratios == (0, 0) + (2,) * 18 + (1,) * 20 + (0,) * 3
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (32, 128, 512)
    assert (cfg.candidate_topk_blocks, cfg.candidate_block_size, cfg.sliding_window) == (2048, 8, 128)


def test_flash_layer_plan_names_the_roles_of_the_table():
    plan = LayerPlan.from_config(V41Config.flash())
    roles = tuple(info.role for info in plan.layers)
    expected = {}
    for i in range(40):
        if i in (0, 1):
            expected[i] = Role.SWA
        elif i in (2, 8, 14):
            expected[i] = Role.FULL
        elif i <= 19:
            expected[i] = Role.REUSE
        elif i == 20:
            expected[i] = Role.FULL_CANDIDATE
        elif i in (24, 28, 32, 36):
            expected[i] = Role.REINDEX
        else:
            expected[i] = Role.REUSE
    assert {i: r for i, r in enumerate(roles)} == expected
    kv = {info.index: info.kv_source for info in plan.layers}
    idx = {info.index: info.index_source for info in plan.layers}
    assert kv[3] == 2 and kv[7] == 2 and kv[9] == 8 and kv[19] == 14 and kv[39] == 20
    assert idx[21] == 20 and idx[25] == 24 and idx[27] == 24 and idx[39] == 36
    assert plan.encoder_layers == tuple(range(20))
    assert plan.kv_owner_layers == (2, 8, 14, 20) and plan.ratio2_owners == (2, 8, 14)
    layer20 = sorted(n for n in plan.prefill_tensor_names if n.startswith("layers.20."))
    assert layer20 == ["layers.20.attn.compressor.norm.weight", "layers.20.attn.compressor.wkv.weight",
                       "layers.20.attn.indexer.k_norm.weight", "layers.20.attn.indexer.wk.weight",
                       "layers.20.attn_norm.weight"]
    assert not any(n.startswith(f"layers.{i}.") for n in plan.prefill_tensor_names for i in range(21, 40))
    assert "head.weight" not in plan.prefill_tensor_names and "norm.weight" not in plan.prefill_tensor_names


@pytest.mark.parametrize("raw, message", [
    ({"model_type": "llama", "text_config": {}}, "model_type 'llama'"),
    ({"architectures": ["LlamaForCausalLM"], "compress_ratios": [0]}, "architectures"),
    ({"hidden_size": 64}, "compress_ratios"),
    ([1, 2], "JSON object"),
])
def test_not_a_v41_config(raw, message):
    with pytest.raises(ConfigError, match=message):
        V41Config.from_hf_dict(raw)


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"compress_ratios": (0, 3, 2, 2, 2, 1, 1, 1, 1, 0, 0)}, "compress_ratios"),
    ({"kv_source_layer_ids": (3, 1, 5)}, "kv_source_layer_ids"),
    ({"candidate_source_layer_id": 3}, "candidate_source"),
    ({"index_topk": 64}, "candidate_topk_blocks"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
])
def test_invalid_fields_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        V41Config.tiny().replace(**change)


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        V41Config.from_json_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        V41Config.from_json_file(tmp_path)
