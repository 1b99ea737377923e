"""Canaries of the asymmetric modes inside SGLang's engine: every scheduler hook target and every piece of
SGLang 0.5.23 code the hooks rely on (asym_decode.py, window_batch.py, prefill_zero.py,
decode_destinations.py, room_lifecycle.py, drain.py, transfer_fallback.py), exactly as pinned, checked in a
process of its own with the CPU import stand-ins; and an asymmetric scheduler's publish applies every hook."""

import json
from pathlib import Path

import pytest

from sglang_asym.sglang_plugin import hooks

from .conftest import REPO, run_python

PREFILL = "sglang.srt.disaggregation.prefill"
DECODE = "sglang.srt.disaggregation.decode"
MOONCAKE = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager"
EXPECTED_SIGNATURES = {
    "sglang.srt.model_loader.loader._initialize_model": ["model_config", "load_config", "quant_config"],
    "sglang.srt.disaggregation.utils.setup_state_kv_args":
        ["kv_args", "token_to_kv_pool", "draft_token_to_kv_pool", "total_kv_layers", "req_to_token_pool"],
    "sglang.srt.disaggregation.utils.get_kv_class": ["transfer_backend", "class_type"],
    "sglang.srt.disaggregation.common.conn.get_dsv41_spec_layout": ["kv_args"],
    f"{PREFILL}.PrefillBootstrapQueue.add": ["self", "req", "num_kv_heads"],
    f"{PREFILL}.PrefillBootstrapQueue.can_prefill_before_bootstrap": ["self", "req"],
    f"{PREFILL}.PrefillBootstrapQueue.pop_bootstrapped": ["self"],
    f"{PREFILL}.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue": ["self", "rids_to_check"],
    f"{PREFILL}.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run":
        ["self", "running_batch", "last_batch", "should_retry_storage_prefetch"],
    "sglang.srt.managers.scheduler.Scheduler.process_pending_chunked_abort": ["self"],
    "sglang.srt.managers.scheduler.Scheduler.run_batch": ["self", "batch", "pp_proxy_tensors"],
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.create_error_response":
        ["self", "message", "err_type", "status_code", "param"],
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result": ["self", "batch", "result"],
    f"{PREFILL}.SchedulerDisaggregationPrefillMixin._retire_aborted_prefill_result": ["self", "req"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.poll": ["self"],
    f"{DECODE}.DecodePreallocQueue._swa_tail_len": ["self", "seq_len"],
    f"{DECODE}.DecodePreallocQueue._send_kv_metadata":
        ["self", "decode_req", "kv_indices", "page_size", "state_indices", "metadata_kwargs"],
    f"{DECODE}.DecodeTransferQueue._commit_transfer_to_req": ["self", "decode_req"],
    f"{DECODE}.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run": ["self", "running_batch"],
    f"{DECODE}.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch": ["self", "running_batch"],
    f"{DECODE}.DecodePreallocQueue.pop_preallocated": ["self", "rids_to_check", "pp_good_rids", "pp_bad_rids"],
    f"{DECODE}.DecodeTransferQueue.pop_transferred": ["self", "rids_to_check"],
    "sglang.srt.managers.scheduler.Scheduler.abort_request": ["self", "recv_req"],
    # mooncake_regions.py: SGLang's four registration calls
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.register":
        ["self", "ptr", "length"],
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.deregister":
        ["self", "ptr"],
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.batch_register":
        ["self", "ptrs", "lengths"],
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.batch_deregister":
        ["self", "ptrs"],
    # transfer_fallback.py: what a recomputed request goes through again
    f"{DECODE}.DecodePreallocQueue.add": ["self", "req", "is_retracted", "is_rebootstrap"],
    "sglang.srt.managers.schedule_batch.Req.detach_kv": ["self"],
    f"{PREFILL}.maybe_release_metadata_buffer": ["req", "allocator"],
    "sglang.srt.disaggregation.utils.MetadataBuffers.set_buf": ["self", "req"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.send":
        ["self", "kv_indices", "state_indices", "num_kv_tokens", "indices_event"],
    "sglang.srt.managers.overlap_utils.resolve_forward_inputs": ["batch", "future_map"],
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.request_state_transfer_indices":
        ["self", "req_pool_idx", "seq_len"],
    "sglang.srt.managers.schedule_batch.ScheduleBatch.init_new":
        ["reqs", "req_to_token_pool", "token_to_kv_pool_allocator", "tree_cache", "model_config", "enable_overlap",
         "spec_algorithm", "chunked_req", "dllm_config"],
    "sglang.srt.managers.schedule_batch.Req.refresh_fill_ids": ["self"],
    # the mixed step: the window chunks' ForwardBatch rides in the decode forward, then SGLang's sampler
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new":
        ["batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm", "extend_position_info",
         "spec_mrope_positions", "kv_loc_plan", "write_cols"],
    "sglang.srt.model_executor.model_runner.ModelRunner.sample": ["self", "logits_output", "forward_batch"],
    f"{MOONCAKE}.send_kvcache": ["self", "mooncake_session_id", "prefill_kv_indices", "dst_kv_ptrs", "dst_kv_indices",
                                 "executor", "dst_layer_ids", "dst_device_kv_indices", "dst_kv_item_len",
                                 "dst_attn_tp_size"],
    f"{MOONCAKE}.maybe_send_extra": ["self", "req", "prefill_state_indices", "executor",
                                     "target_rank_registration_info"],
    f"{MOONCAKE}.transfer_worker": ["self", "queue", "executor", "staging_buffer", "worker_index"],
    f"{MOONCAKE}._state_stride_mismatch": ["self", "src_data_ptrs", "dst_data_ptrs", "item_lens", "dst_item_lens",
                                           "state_type", "force_flat", "src_layer_ids", "dst_layer_ids"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.get_transfer_metric": ["self"],
    # room_lifecycle.py's overrides on P's exact-payload manager and sender
    "sglang.srt.disaggregation.common.conn.CommonKVManager.conclude_transfer":
        ["self", "bootstrap_room", "status", "targets", "failure_reason"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.__init__":
        ["self", "mgr", "bootstrap_addr", "bootstrap_room", "req_has_disagg_prefill_dp_rank"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.clear": ["self"],
    "sglang.srt.disaggregation.common.conn.CommonKVManager.update_status": ["self", "bootstrap_room", "status"],
    "sglang.srt.disaggregation.common.conn.CommonKVManager.send_kv_status_message":
        ["self", "targets", "bootstrap_room", "status", "failure_reason"],
    # drain.py's hook in an asymmetric server's launcher process
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request": ["self", "obj", "request"],
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.force_exit_handler": ["self"],
    # admission_check.py's hook in an asymmetric server's launcher process
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state": ["self", "obj", "request"],
    # relayed_refusal.py's hook in an asymmetric server's launcher process
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_finish_reason":
        ["self", "out", "state", "is_stream"],
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_req": ["self", "recv_obj"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.abort": ["self"],
    "sglang.srt.disaggregation.common.conn.CommonKVManager._room_notify_targets": ["self", "bootstrap_room"],
    # deterministic.py's scheduler patches (SGLang's --enable-deterministic-inference on CPU)
    "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode": ["self"],
    "sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config": ["self"],
    "sglang.srt.disaggregation.utils.build_transfer_entry_pairs":
        ["src_layer_ids", "dst_layer_ids", "n_src", "n_dst", "allow_positional_fallback"],
}


@pytest.fixture(scope="module")
def report() -> dict:
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "asym_hooks"], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_every_hook_target_and_relied_on_function_has_the_pinned_signature(report):
    assert report["signatures"] == EXPECTED_SIGNATURES


def test_every_relied_on_line_is_still_there(report):
    assert report["missing_lines"] == {}


def test_an_asymmetric_scheduler_applies_every_hook(report):
    assert report["applied"] == sorted(t for t, _, _ in hooks.scheduler_hook_table())
    assert report["state_types"] == ["SWA", "DSV4_REQUEST_STATE"]


def test_a_forced_exit_answers_every_request_in_flight_with_a_503_abort():
    """drain.py: SIGTERM while SGLang counts the server unhealthy skips the drain; every request still in
    flight is finished through SGLang's own abort handler with a 503 that says why, so its handler returns."""
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "force_exit"], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    report = json.loads(lines[0].removeprefix("REPORT "))
    reason = {"type": "abort", "message": report["message"], "status_code": 503}
    assert report["original_called"] == [True] and report["in_flight_after"] == []
    assert report["answers"] == {rid: {"woken": True, "finished": True, "finish_reason": reason}
                                 for rid in ("plain", "streamed")}
    assert "SIGTERM" in report["message"]


def test_a_chunked_prompt_whose_room_failed_goes_to_sglangs_chunked_abort():
    """prefill_stop.py: before P's scheduling step, a request in chunked prefill whose KV sender polls Failed
    becomes SGLang's pending chunked abort (finished with a 500 that says why); nothing else does."""
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "prefill_stop"], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    report = json.loads(lines[0].removeprefix("REPORT "))
    from sglang_asym.sglang_plugin.prefill.stop import ROOM_FAILED_MESSAGE

    untouched = {"result": "plan", "pending_is_req_at_original": False, "reason": None}
    assert report == {
        "failed": {"result": "plan", "pending_is_req_at_original": True,
                   "reason": {"message": ROOM_FAILED_MESSAGE, "status_code": 500}},
        "transferring": untouched, "waiting": untouched, "failed_but_bootstrapping": untouched,
        "failed_other_pending": untouched, "no_sender": untouched}


def test_the_fallback_reads_sglangs_own_failure_words():
    """transfer_fallback.py recognises a failed handshake or transfer by the words SGLang's decode queues put
    in the abort (read from the pinned SGLang's source), and an abort on P alone by the words
    room_lifecycle.py sends D."""
    import importlib.util
    import inspect

    from sglang_asym.sglang_plugin.shared import room_lifecycle
    from sglang_asym.sglang_plugin.decode import transfer_fallback

    decode = (Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt" / "disaggregation"
              / "decode.py").read_text()
    assert transfer_fallback.FAILURE_PREFIXES == ("Decode handshake failed", "Decode transfer failed")
    for prefix in transfer_fallback.FAILURE_PREFIXES:
        assert decode.count(f'f"{prefix} for request rank') == 1, prefix
    assert "note_aborted(room)" in inspect.getsource(room_lifecycle.RoomLifecycleSender.abort)
    source = inspect.getsource(room_lifecycle.RoomLifecycleManager.send_kv_status_message)
    assert "PREFILL_ABORT_WORDS" in source and transfer_fallback.PREFILL_ABORT_WORDS == "aborted on the prefill worker"
