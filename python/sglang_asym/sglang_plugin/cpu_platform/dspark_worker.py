"""`--speculative-algorithm DSPARK` on SGLang's engine on CPU: the platform's speculative worker.

SGLang 0.5.23 asks an out-of-tree platform for its speculative worker class
(`SpeculativeAlgorithm.create_worker` -> `current_platform.get_speculative_worker_cls`); the CPU platform
answers DSPARK with `AsymDSparkWorker`. SGLang's own DSparkWorkerV2 runs a second model runner with a
FlashMLA draft pool and CUDA kernels; this worker keeps SGLang's scheduler, slot allocation, verify
window, TARGET_VERIFY forward plumbing and result processing, and drafts with the project's DSpark
drafter (model/dspark.py: the checkpoint's `mtp.*` blocks over the reference model SGLang's forward runs,
sharing its embedding and head), step by step as dspark_step.py describes:
  extend  the target forward with CaptureHiddenMode.FULL (prompt chunks, retracted requests computed
          again, an asym-decode window): its logits as SGLang samples them, and every row's drafter
          features into the request's drafter context; the sampled token is the first bonus token;
  decode  alloc_verify_window (SGLang's) over the slots the scheduler allocated for 1 + k rows, k drafts
          per request, ONE TARGET_VERIFY forward (q_len = 1 + k), SGLang's greedy accept, and the result
          in DSparkWorkerV2's layout (accept_lens, out tokens, the next bonus and sequence lengths).
There is no draft model runner, draft KV pool or device graph. Greedy requests only, without grammars: the
launcher refuses sampled and constrained ones with a 400 (patches.refuse_sampled_speculation), since
the drafter's proposals are checked by argmax without a grammar mask.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from ...speculative import drafter_from_checkpoint, max_draft_tokens
from .dspark_step import DraftContexts, VerifyRows, speculative_step
from .layer_loop import layer_loop_of

log = logging.getLogger(__name__)


class AsymDSparkWorker(BaseSpecWorker):
    """SGLang's scheduler-facing DSpark worker interface over the CPU route's layer loop and the project's drafter."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any, **_: Any) -> None:
        from sglang.srt.runtime_context import get_spec

        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = target_worker.device
        loop = layer_loop_of(self.model_runner.model)
        reference = loop.model if loop is not None and loop.full else None
        if reference is None:
            raise ValueError("--speculative-algorithm DSPARK on sglang-asym's CPU engine needs the DeepSeek-V4.1 "
                             f"reference layers; {type(self.model_runner.model).__name__} does not run them")
        drafter = drafter_from_checkpoint(reference, server_args.model_path)
        self.verify_num_draft_tokens = int(get_spec().speculative_num_draft_tokens)
        self.speculative_num_draft_tokens = self.verify_num_draft_tokens
        self.gamma = self.verify_num_draft_tokens - 1
        limit = max_draft_tokens(reference.cfg.dspark_block_size)
        if not 1 <= self.gamma <= limit:
            raise ValueError(f"--speculative-num-draft-tokens {self.verify_num_draft_tokens}: the CPU engine's DSpark "
                             f"drafts 1 .. {limit} tokens per step (num-draft-tokens 2 .. {limit + 1})")
        self.contexts = DraftContexts(drafter, reference.cfg.dspark_target_layer_ids)
        self._block_pos_offsets = torch.arange(self.verify_num_draft_tokens, dtype=torch.int64)
        log.info("sglang-asym: DSpark speculative decoding on CPU, %d draft tokens per step (%d draft blocks)",
                 self.gamma, len(drafter.mtp))

    # ---- what the scheduler asks of a DSpark worker; nothing to build without a draft runner ---------------
    def alloc_memory_pool(self, **kwargs: Any) -> None:
        return None

    def init_attention_backends(self) -> None:
        return None

    def init_cuda_graphs(self) -> None:
        return None

    def set_dspark_forced_budget_frac(self, frac: float | None) -> None:
        return None

    def dump_info_records(self) -> None:
        return None

    def clear_info_records(self) -> None:
        return None

    def block_accept_estimate_log_suffix(self) -> None:
        return None

    def get_confidence_budget_prepare(self) -> None:
        return None

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.contexts.forget(rid)

    # ---- steps -----------------------------------------------------------------------------------------------
    def forward_batch_generation(self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None, *,
                                 pp_proxy_tensors: Any = None) -> Any:
        if batch.forward_mode.is_idle():
            return self._idle_result(on_publish)
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._forward_extend(batch, on_publish)
        if batch.has_grammar:
            raise ValueError("DSpark on sglang-asym's CPU engine does not serve constrained (grammar) decoding")
        return self._forward_decode(batch, on_publish)

    def _forward_extend(self, batch: Any, on_publish: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

        result = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        features = result.logits_output.hidden_states
        if features is None:
            raise RuntimeError("the reference layers returned no drafter features for a FULL-capture extend")
        at = 0
        for req, slot, prefix, n in zip(batch.reqs, batch.req_pool_indices.tolist(), batch.prefix_lens,
                                        batch.extend_lens):
            self.contexts.observe(int(slot), req.rid, features[at:at + n], int(prefix))
            at += n
        result.logits_output.hidden_states = None
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = make_next_draft_input(bonus_tokens=result.next_token_ids,
                                                        new_seq_lens=batch.seq_lens)
        return result

    def _forward_decode(self, batch: Any, on_publish: Any) -> Any:
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input
        from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window

        draft_input = batch.spec_info
        bs, q = len(batch.seq_lens), self.verify_num_draft_tokens
        seq_lens = batch.seq_lens
        window = alloc_verify_window(
            batch=batch, bs=bs, device=self.device, verify_num_draft_tokens=q,
            block_pos_offsets=self._block_pos_offsets, model_runner=self.model_runner,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu)
        verified: dict[str, Any] = {}

        def verify(verify_ids: torch.Tensor) -> VerifyRows:
            logits_output = self._verify_forward(batch, verify_ids, window)
            verified["logits_output"] = logits_output
            return VerifyRows(logits_output.next_token_logits, logits_output.hidden_states)

        slots = [int(s) for s in batch.req_pool_indices.tolist()]
        step = speculative_step(self.contexts, slots, [r.rid for r in batch.reqs], draft_input.bonus_tokens,
                                seq_lens, self.gamma, verify)
        logits_output = verified["logits_output"]
        logits_output.hidden_states = None
        self.model_runner.ngram_embedding_manager.update_after_verify(
            verify_ids_2d=step.verify_ids, req_pool_indices=batch.req_pool_indices, commit_lens=step.commit_lens)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, step.out_tokens.reshape(-1), chain_stride=q)
        if on_publish is not None:
            on_publish(step.new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=step.out_tokens.reshape(-1), accept_lens=step.commit_lens,
            block_accept_lens=step.commit_lens, can_run_cuda_graph=False,
            next_draft_input=make_next_draft_input(bonus_tokens=step.bonus, new_seq_lens=step.new_seq_lens),
            speculative_num_draft_tokens=q, new_seq_lens=step.new_seq_lens)

    def _verify_forward(self, batch: Any, verify_ids: torch.Tensor, window: Any) -> Any:
        """SGLang's TARGET_VERIFY forward over the verify window (TargetVerifyExecutor.run_non_compact's path)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        q = self.verify_num_draft_tokens
        verify_input = DFlashVerifyInput(
            draft_token=verify_ids.reshape(-1), positions=window.positions_2d.reshape(-1), draft_token_num=q,
            custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL, live_seq_lens_cpu=batch.seq_lens_cpu,
            kv_loc_plan=window.kv_loc_plan)
        batch.out_cache_loc = window.verify_cache_loc
        seq_lens_cpu, seq_lens_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        if seq_lens_cpu is not None:  # the verify rows' keys count in the forward's lengths
            batch.seq_lens_cpu = seq_lens_cpu + q
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        try:
            forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu, seq_lens_sum
        out = self.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True,
                                                          skip_attn_backend_init=True)
        return out.logits_output

    def _idle_result(self, on_publish: Any) -> Any:
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        next_input = make_next_draft_input(bonus_tokens=empty, new_seq_lens=empty)
        if on_publish is not None:
            on_publish(next_input.new_seq_lens)
        return GenerationBatchResult(
            logits_output=None, next_token_ids=empty, accept_lens=torch.empty(0, dtype=torch.int32),
            block_accept_lens=torch.empty(0, dtype=torch.int32), next_draft_input=next_input,
            can_run_cuda_graph=False, speculative_num_draft_tokens=self.verify_num_draft_tokens,
            new_seq_lens=next_input.new_seq_lens)
