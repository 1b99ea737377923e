"""SGLang's own V4 model and KV pool for the real Flash config, built in a separate CPU process
(meta device), checked against the weight-name mapping, the prefill role's tensor list and the
core's cache row formats. Also pins the SGLang callables the build relies on."""

import json
from collections import Counter

import pytest

from sglang_asym.config import V41Config
from sglang_asym.formats import row_bytes
from sglang_asym.layer_plan import LayerPlan
from sglang_asym.sglang_plugin.prefill.role import PrefillRole
from sglang_asym.sglang_plugin.shared.weight_names import LoadTarget, load_target, sglang_name

from .conftest import REPO, run_python
from .meta_model import released_tensor_names

FLASH = V41Config.flash()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "flash.json"
    done = run_python([str(REPO / "test/sglang_plugin/inspect_sglang.py"), "--preset", "flash", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith(f"1258 SGLang parameters, built in ")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def params(report):
    return {name: (tuple(shape), dtype) for name, shape, dtype in report["parameters"]}


def test_sglang_version_and_parameter_count(report, params):
    assert report["sglang_version"] == "0.5.23"
    assert report["quantized"] is True
    assert len(params) == 1258


def test_parameter_shapes_and_dtypes(params):
    expected = {
        "model.embed_tokens.weight": ((129280, 5120), "bfloat16"),
        "lm_head.weight": ((129280, 5120), "bfloat16"),
        "model.norm.weight": ((5120,), "bfloat16"),
        "model.layers.0.hc_attn_fn": ((24, 20480), "float32"),
        "model.layers.0.self_attn.attn_sink": ((64,), "float32"),
        "model.layers.0.self_attn.wqkv_a.weight": ((1792, 5120), "float8_e4m3fn"),
        "model.layers.0.self_attn.wqkv_a.weight_scale_inv": ((56, 160), "float32"),
        "model.layers.0.self_attn.wo_a.weight": ((8192, 4096), "bfloat16"),
        "model.layers.2.self_attn.compressor.wgate.weight": ((512, 5120), "bfloat16"),
        "model.layers.20.self_attn.compressor.wkv.weight": ((512, 5120), "bfloat16"),
        "model.layers.20.self_attn.indexer.wk.weight": ((128, 512), "bfloat16"),
        "model.layers.5.mlp.experts.w13_weight": ((384, 4608, 2560), "int8"),
        "model.layers.5.mlp.experts.w13_weight_scale_inv": ((384, 4608, 160), "float32"),
        "model.layers.5.mlp.experts.w2_weight": ((384, 5120, 1152), "int8"),
        "model.layers.5.mlp.shared_experts.gate_up_proj.weight": ((4608, 5120), "float8_e4m3fn"),
        "model.layers.1.engram.embed.weight": ((384006168, 256), "float8_e4m3fn"),
        "model.layers.14.engram.embed.weight": ((384016682, 256), "float8_e4m3fn"),
    }
    assert {name: params[name] for name in expected} == expected
    assert "model.layers.20.self_attn.compressor.wgate.weight" not in params  # ratio-1 source: no gate


def test_our_rename_equals_sglangs(report):
    names = released_tensor_names(FLASH)
    assert len(names) == len(report["remap"])
    assert {name: sglang_name(name) for name in names} == report["remap"]


def test_every_released_tensor_has_a_parameter(params):
    targets = {}
    for name in released_tensor_names(FLASH):
        target = load_target(name, params)
        if target is not None:
            targets.setdefault(target.param, []).append(name)
    not_loaded = Counter(p.split(".", 3)[3] for p in params if p not in targets)
    # SGLang's own KV-cache scales, and the Engram tables (not backbone tensors in tensor_specs).
    assert not_loaded == Counter({
        "self_attn.attn_mqa.k_scale": 40, "self_attn.attn_mqa.v_scale": 40,
        "engram.q_weight": 2, "engram.k_weight": 2, "engram.embed.weight": 2, "engram.embed.scale": 2,
        "engram.wkv.weight": 2, "engram.wkv.weight_scale_inv": 2,
    })
    assert len(targets["model.layers.3.mlp.experts.w13_weight"]) == 2 * 384
    assert targets["model.layers.3.self_attn.wqkv_a.weight"] == ["layers.3.attn.wq_a.weight", "layers.3.attn.wkv.weight"]
    assert targets["model.layers.3.self_attn.wo_a.weight"] == ["layers.3.attn.wo_a.weight", "layers.3.attn.wo_a.scale"]


def test_load_targets_by_kind(params):
    assert load_target("layers.7.ffn.experts.11.w3.scale", params) == LoadTarget(
        "model.layers.7.mlp.experts.w13_weight_scale_inv", "w3", 11)
    assert load_target("layers.7.ffn.experts.11.w2.weight", params) == LoadTarget(
        "model.layers.7.mlp.experts.w2_weight", "w2", 11)
    assert load_target("layers.7.ffn.shared_experts.w1.scale", params) == LoadTarget(
        "model.layers.7.mlp.shared_experts.gate_up_proj.weight_scale_inv", "gate")
    assert load_target("layers.7.attn.wkv.scale", params) == LoadTarget(
        "model.layers.7.self_attn.wqkv_a.weight_scale_inv", "kv")
    assert load_target("layers.7.attn.wo_a.scale", params) == LoadTarget(
        "model.layers.7.self_attn.wo_a.weight", "dequant_scale")
    assert load_target("layers.8.attn.compressor.wgate.weight", params) == LoadTarget(
        "model.layers.8.self_attn.compressor.wgate.weight")
    assert load_target("layers.8.ffn.gate.bias", params) == LoadTarget(
        "model.layers.8.mlp.gate.e_score_correction_bias")
    assert load_target("layers.8.ffn.gate.bias_vl", params) is None
    assert load_target("head.weight", params) == LoadTarget("lm_head.weight")
    with pytest.raises(KeyError) as err:
        load_target("layers.40.attn_norm.weight", params)
    assert "'layers.40.attn_norm.weight' maps to 'model.layers.40.input_layernorm.weight'" in str(err.value)


def test_prefill_role_parameters(params):
    plan = LayerPlan.from_config(FLASH)
    # LayerPlan names weights; a quantized weight's `.scale` travels with it.
    kept = [n for n in released_tensor_names(FLASH)
            if n in plan.prefill_tensor_names or n.removesuffix(".scale") + ".weight" in plan.prefill_tensor_names]
    targets = {n: load_target(n, params) for n in kept}
    assert sorted(n for n, t in targets.items() if t is None) == [f"layers.{i}.ffn.gate.bias_vl" for i in
                                                                  sorted(range(20), key=str)]
    loaded = {t.param for t in targets.values() if t is not None}
    assert {p for p in loaded if p.startswith("model.layers.20.")} == {
        "model.layers.20.input_layernorm.weight",
        "model.layers.20.self_attn.compressor.wkv.weight",
        "model.layers.20.self_attn.compressor.norm.weight",
        "model.layers.20.self_attn.indexer.wk.weight",
        "model.layers.20.self_attn.indexer.k_norm.weight",
    }
    layer_of = {p: int(p.split(".")[2]) for p in loaded if p.startswith("model.layers.")}
    assert max(layer_of.values()) == 20
    assert {p for p in loaded if not p.startswith("model.layers.")} == {"model.embed_tokens.weight"}
    encoder = {p for p in params if p.startswith("model.layers.") and int(p.split(".")[2]) < 20
               and "attn_mqa" not in p and ".engram." not in p}
    assert encoder <= loaded


def test_kv_pool_layout_v41(report):
    v41 = report["kv_pools"]["v41"]
    assert v41["pd_kv_layout"] == "v41,c1:v41_fp4,c2:v41_fp4"
    contiguous = [(b["name"], b["item_bytes"], b["rows_per_item"]) for b in v41["contiguous"]]
    assert contiguous == [
        ("kv.c1.L20", 73728, 256), ("index.c1.L20", 17408, 256),
        ("kv.c2.L2", 36864, 128), ("kv.c2.L8", 36864, 128), ("kv.c2.L14", 36864, 128),
        ("index.c2.L2", 8704, 128), ("index.c2.L8", 8704, 128), ("index.c2.L14", 8704, 128),
    ]
    main_kv, index_key, swa = row_bytes("nvfp4", 512), row_bytes("mxfp4", 128), row_bytes("fp8", 512)
    assert (main_kv, index_key, swa) == (288, 68, 528)
    for buf in v41["contiguous"]:
        assert buf["item_bytes"] // buf["rows_per_item"] == (main_kv if buf["name"].startswith("kv.") else index_key)
    assert [(b["name"], b["item_bytes"]) for b in v41["state"]] == [(f"swa.L{i}", 256 * swa) for i in range(40)]
    assert [(b["name"], b["item_bytes"], b["rows_per_item"]) for b in v41["request_state"]] == [
        ("pair_ring.L2", 8192, 2), ("pair_ring.L8", 8192, 2), ("pair_ring.L14", 8192, 2)]


def test_kv_pool_layout_v4(report):
    v4 = report["kv_pools"]["v4"]
    assert v4["pd_kv_layout"] == "v4,c1:v4,c2:v4"
    assert [b["item_bytes"] // b["rows_per_item"] for b in v4["contiguous"]] == [585, 68, 585, 585, 585, 68, 68, 68]
    assert {b["item_bytes"] for b in v4["state"]} == {256 * 585}


def test_sglang_callables_the_build_relies_on(report):
    sig = report["signatures"]
    assert sig["DeepseekV4ForCausalLM.__init__"] == ["self", "config", "quant_config", "prefix"]
    assert sig["DeepseekV4ForCausalLM.load_weights"] == ["self", "weights", "is_nextn"]
    assert sig["DeepseekV4ForCausalLM.post_load_weights"] == ["self", "is_nextn", "weight_names"]
    assert sig["DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format"] == ["name", "is_nextn", "num_hidden_layers"]
    assert sig["EngramHasher.from_config"] == ["config", "layout", "image_token_id"]
    assert sig["rope_variant.get_device"] == ["device_id"]
    assert sig["DeepSeekV4TokenToKVPool.__init__"] == [
        "self", "max_num_reqs", "swa_size", "c4_size", "c128_size", "c4_state_pool_size", "c128_state_pool_size",
        "page_size", "swa_page_size", "dtype", "c4_state_dtype", "c128_state_dtype", "qk_nope_head_dim",
        "qk_rope_head_dim", "indexer_head_dim", "layer_num", "device", "enable_memory_saver", "compression_ratios",
        "sliding_window", "start_layer", "end_layer", "enable_hisparse", "online_mtp_max_draft_tokens",
        "num_req_slots", "unified_fp8", "kv_source_layers", "full_size", "is_draft_worker", "kv_layout",
        "compressed_kv_layout"]
    for name in ("pd_kv_layout", "get_contiguous_buf_infos", "get_state_buf_infos", "get_request_state_buf_infos"):
        assert sig[f"DeepSeekV4TokenToKVPool.{name}"] == ["self"]
    assert sig["loader._initialize_model"] == ["model_config", "load_config", "quant_config"]
    assert sig["disaggregation.utils.setup_state_kv_args"] == [
        "kv_args", "token_to_kv_pool", "draft_token_to_kv_pool", "total_kv_layers", "req_to_token_pool"]
    assert sig["disaggregation.utils.build_transfer_entry_pairs"] == [
        "src_layer_ids", "dst_layer_ids", "n_src", "n_dst", "allow_positional_fallback"]
    assert sig["MooncakeKVManager._send_kvcache_generic"] == [
        "self", "mooncake_session_id", "src_data_ptrs", "dst_data_ptrs", "item_lens", "prefill_data_indices",
        "dst_data_indices", "executor", "state_type", "force_flat", "src_layer_ids", "dst_layer_ids",
        "dst_device_data_indices", "dst_device_data_ptrs", "dst_item_lens", "bootstrap_room"]
    assert sig["MooncakeKVManager.send_kvcache"][:5] == [
        "self", "mooncake_session_id", "prefill_kv_indices", "dst_kv_ptrs", "dst_kv_indices"]
    assert sig["MooncakeKVManager.maybe_send_extra"] == [
        "self", "req", "prefill_state_indices", "executor", "target_rank_registration_info"]
    assert sig["deepseek_v4.make_pp_layers"] == ["num_hidden_layers", "layer_fn", "prefix", "return_tuple",
                                                 "offloader_kwargs", "final_read", "stage_facts"]
    assert sig["deepseek_v4.ParallelLMHead.__init__"][:3] == ["self", "num_embeddings", "embedding_dim"]
    assert sig["deepseek_v2.DeepseekV2MoE.__init__"][:3] == ["self", "config", "layer_id"]
    assert sig["PrefillBootstrapQueue.add"] == ["self", "req", "num_kv_heads"]
    assert sig["disaggregation.utils.prepare_abort"] == ["req", "error_message", "status_code"]
    assert sig["disaggregation.utils.is_unadmitted_reject"] == ["req"]


def test_sglang_code_the_prefill_truncation_relies_on(report):
    assert report["relied_on"] == {fact: True for fact in report["relied_on"]}
    assert len(report["relied_on"]) == 19


def test_engram_tables_other_than_flash_need_their_vocab_size():
    from .meta_model import sglang_hf_config

    cfg = FLASH.replace(engram_num_embeddings=(1000, 2000))
    with pytest.raises(ValueError) as err:
        sglang_hf_config(cfg)
    assert str(err.value) == ("config has Engram tables but no engram_vocab_size (SGLang derives the table "
                              "layout from it); only the Flash tables' value is known")


# ---- the prefill role's truncated model, loaded through SGLang's load_weights (meta device) --------


@pytest.fixture(scope="module")
def prefill(report):
    return report["prefill_role"]


def test_prefill_role_names_are_the_layer_plan_plus_scales_and_encoder_engram():
    role, plan = PrefillRole.from_config(FLASH), LayerPlan.from_config(FLASH)
    assert plan.prefill_tensor_names <= role.checkpoint_names
    extra = role.checkpoint_names - plan.prefill_tensor_names
    engram = {n for n in extra if ".engram." in n}
    assert engram == {f"layers.{i}.engram.{leaf}" for i in (1, 14) for leaf in
                      ("embed.weight", "embed.scale", "wkv.weight", "wkv.scale", "q_weight", "k_weight")}
    scales = extra - engram
    assert all(n.endswith(".scale") and n.removesuffix(".scale") + ".weight" in plan.prefill_tensor_names
               for n in scales)
    # per encoder layer: 384 routed + 1 shared expert x (w1, w2, w3); wq_a, wkv, wq_b, wo_a, wo_b; and the
    # indexer wq_b of the three encoder index sources (2, 8, 14)
    assert Counter(n.rsplit(".", 2)[-2] for n in scales) == Counter(
        {"w1": 7700, "w2": 7700, "w3": 7700, "wq_b": 23, "wq_a": 20, "wkv": 20, "wo_a": 20, "wo_b": 20})
    assert (len(plan.prefill_tensor_names), len(role.checkpoint_names)) == (23507, 46722)


def test_truncated_model_holds_exactly_the_layer_plan_tensors(prefill):
    role = PrefillRole.from_config(FLASH)
    params = {name for name, _, _ in prefill["parameters"]}
    targets = {n: load_target(n, params) for n in role.checkpoint_names}  # KeyError if a name has no parameter
    from_checkpoint = {t.param for t in targets.values() if t is not None}
    sglang_own = {f"model.layers.{i}.self_attn.attn_mqa.{s}" for i in range(20) for s in ("k_scale", "v_scale")}
    assert params == from_checkpoint | sglang_own
    assert not from_checkpoint & sglang_own
    from_layer_plan = {t.param for n, t in targets.items() if t is not None and ".engram." not in n}
    engram = {p for p in params if ".engram." in p}
    assert len(engram) == 12
    assert from_layer_plan == params - sglang_own - engram
    assert {p for p in params if p.startswith("model.layers.20.")} == {
        "model.layers.20.input_layernorm.weight",
        "model.layers.20.self_attn.compressor.wkv.weight",
        "model.layers.20.self_attn.compressor.norm.weight",
        "model.layers.20.self_attn.indexer.wk.weight",
        "model.layers.20.self_attn.indexer.k_norm.weight",
    }
    assert not {p for p in params if p.startswith("model.layers.") and int(p.split(".")[2]) > 20}
    assert {p for p in params if not p.startswith("model.layers.")} == {"model.embed_tokens.weight"}
    assert len(params) == 642


def test_truncated_model_structure(prefill):
    assert prefill["layers"] == ["DeepseekV4PlatformDecoderLayer"] * 21 + ["PPMissingLayer"] * 19
    assert prefill["layer_range"] == [0, 21]
    assert prefill["head_and_norm"] == ["PPMissingLayer", "PPMissingLayer"]


def test_load_weights_through_the_filter_loads_every_parameter(prefill):
    from sglang_asym.checkpoint.specs import checkpoint_tensor_specs, disk_layout

    role = PrefillRole.from_config(FLASH)
    stored = [t.name for s in checkpoint_tensor_specs(FLASH) for t in disk_layout(s, "release")]
    assert sum(n.startswith("mtp.") for n in stored) > 0  # the DSpark draft is in the stream, and skipped
    assert prefill["passed"] == sorted(role.checkpoint_names)
    assert prefill["skipped"] == len(stored) - len(role.checkpoint_names) == 49097
    # SGLang warns "Some weights are not initialized from checkpoints" for any parameter the stream
    # missed; it logs nothing of the kind, and drops only the vision routing biases it always drops.
    assert prefill["sglang_log"] == ["INFO: Finished streaming dequant fp8 wo_a",
                                     "INFO: Skipped checkpoint tensors not wired yet: gate.bias_vl=20"]
