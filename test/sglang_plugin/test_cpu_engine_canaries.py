"""Canaries of SGLang's own engine on CPU: every symbol cpu_patches.py changes, exactly as the pinned SGLang
0.5.23 has it, applied in a process of its own (the modules need the CPU import stand-ins); the platform's entry
point and class; and the reference model recovered from SGLang's loaded parameters equals the checkpoint."""

import json

import pytest

from sglang_asym.checkpoint import write_tokenizer
from sglang_asym.checkpoint.quantization import without_quantization
from sglang_asym.checkpoint.writer import write_checkpoint
from harness.sglang_shapes import sglang_small

from .conftest import REPO, run_python

EXPECTED_TARGETS = {
    "sglang.srt.entrypoints.openai.chat_encoding.resolve_chat_encoding_spec":
        {"params": ["hf_config", "tokenizer", "tool_call_parser"]},
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request":
        {"params": ["self", "obj", "input_ids"]},
    "sglang.srt.mem_cache.kv_cache_configurator.reject_out_of_tree_path": {"params": ["platform", "subsystem"]},
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.select_dsv4_kv_layout": {"params": []},
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend.init_forward_metadata":
        {"params": ["self", "forward_batch"]},
    "sglang.kernels.ops.layernorm.mhc.mhc_combine": {"params": ["x_flat", "pre", "hc", "out_dtype"]},
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused":
        {"params": ["self", "layer_id", "loc", "cache_k", "freqs_cis"]},
    "sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache.store_fp4_index_k_cache":
        {"params": ["input", "cache", "loc", "page_size", "rne"]},
    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._snapshot_prefill_shared_reads":
        {"params": ["self", "forward_batch", "num_qo_tokens"]},
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices": {"value": True},
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new":
        {"params": ["batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm",
                    "extend_position_info", "spec_mrope_positions", "kv_loc_plan", "write_cols"]},
    "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req":
        {"params": ["self", "decode_req"]},
    "sglang.srt.layers.rotary_embedding.rope_variant.get_device": {"params": ["device_id"]},
    "sglang.srt.layers.rotary_embedding.factory.get_rope_wrapper":
        {"params": ["head_size", "rotary_dim", "max_position", "base", "is_neox_style", "rope_scaling", "dtype",
                    "partial_rotary_factor", "device"]},
    "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM._prewarm_mhc_kernels": {"params": ["self"]},
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk":
        {"params": ["self", "req", "allow_send"]},
    "sglang.srt.arg_groups.speculative_hook._handle_dspark": {"params": ["server_args"]},
    "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func":
        {"params": ["req_pool_indices", "req_to_token", "start_offset", "end_offset", "out_cache_loc", "batch_size"]},
    "sglang.srt.mem_cache.allocation.get_last_loc":
        {"params": ["req_to_token", "req_pool_indices_tensor", "prefix_lens_tensor"]},
}
# What the CPU engine's DSpark worker (dspark_worker.py) and the platform's speculative answers call in SGLang
DSPARK_SIGNATURES = {
    "sglang.srt.speculative.dspark_components.dspark_planner.alloc_verify_window":
        ["batch", "bs", "device", "verify_num_draft_tokens", "block_pos_offsets", "model_runner", "seq_lens_cpu",
         "bonus", "anchor_ids"],
    "sglang.srt.speculative.dspark_components.dspark_draft.make_next_draft_input": ["bonus_tokens", "new_seq_lens"],
    "sglang.srt.speculative.dflash_info.DFlashVerifyInput.prepare_for_verify":
        ["self", "batch", "target_worker", "defer_metadata_init"],
    "sglang.srt.layers.logprob_processor.compute_spec_logprobs":
        ["batch", "logits_output", "predict", "accept_index", "chain_stride"],
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation":
        ["self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify", "skip_attn_backend_init",
         "capture_hidden_mode", "return_kv_loc_plan"],
    "sglang.srt.platforms.interface.SRTPlatform.get_speculative_cache_locs_fn": ["self"],
    "sglang.srt.platforms.interface.SRTPlatform.get_speculative_worker_cls": ["self", "algorithm"],
    "sglang.srt.platforms.interface.SRTPlatform.supports_speculative_algorithm": ["self", "algorithm"],
}


def _report(*args) -> dict:
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), *args], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


@pytest.fixture(scope="module")
def patches() -> dict:
    return _report("cpu_patches")


def test_every_patched_symbol_is_as_pinned(patches):
    assert patches["targets"] == EXPECTED_TARGETS


def test_every_hook_is_applied_and_the_attribute_set(patches):
    hooked = {t for t, v in EXPECTED_TARGETS.items() if "params" in v}
    assert hooked <= set(patches["applied"])
    assert patches["attributes_now"] == {
        "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices": False}


def test_the_platform_entry_point_and_class(patches):
    assert patches["platform_entry_points"] == [["sglang_asym", "sglang_asym.sglang_plugin.cpu_platform:activate"]]
    assert patches["activate"] == "sglang_asym.sglang_plugin.cpu_platform.platform.AsymCpuPlatform"
    assert (patches["platform"], patches["out_of_tree"]) == ("AsymCpuPlatform", True)


def test_the_reference_model_from_sglangs_parameters_equals_the_checkpoint(tmp_path):
    write_checkpoint(tmp_path, without_quantization(sglang_small()), seed=5, precision="release", num_shards=3,
                     progress=False)
    write_tokenizer(tmp_path, sglang_small())
    report = _report("weights", str(tmp_path))
    assert report["same_keys"] and report["num_differing"] == 0, report["differing"]
    assert report["compared"] == 2838
    assert (report["dropped"], report["dropped_are_zero"]) == (40, True)  # gate.bias_vl: vision routing only


def test_what_the_dspark_worker_relies_on_is_as_pinned(patches):
    assert patches["dspark_missing_lines"] == {t: [] for t in patches["dspark_missing_lines"]}
    assert len(patches["dspark_missing_lines"]) == 6
    assert patches["dspark_signatures"] == DSPARK_SIGNATURES


def test_the_platform_serves_dspark_and_nothing_else(patches):
    assert patches["speculative"] == {"supports": ["DSPARK"], "worker": "AsymDSparkWorker", "eagle_worker": None,
                                      "torch_cache_locs": True}
