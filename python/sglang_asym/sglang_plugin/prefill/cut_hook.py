"""P's cut inside SGLang's own DeepseekV4Model loop: one hook, bound at model load, the same on every device.

`install_prefill_cut` binds two wrappers to the truncated model's instance (model.py builds it):
- around `DeepseekV4Model._forward_layers_hc_pre_from_prev` (the V4.1 layer loop `_forward_impl` calls):
  the loop runs with `end_layer` = the last KV source L, so layers 0..L-1 run as SGLang runs them and
  layer L-1's pending mHC post completes in SGLang's own epilogue (`state.materialized`); then layer L's
  input is SGLang's mHC combine of that state (`deepseek_v4_mhc.combine(layer.attn_hc, ...)`), and its
  compressed KV and index keys are written by the attention backend's
  `forward_low_ratio_sources(q_lora=None, run_indexer=False)`, under the forward metadata of layers
  0..L-1, at the batch's absolute positions. (SGLang's `write_tail_source_kv` is the same call but
  leaves `tail_source_kv_layer_id` set, which would skip the next forward's compressor.) Layer L's
  attention output, its FFN and its SWA ring (needs `wkv`, which P does not hold) never run.
- around `DeepseekV4ForCausalLM.forward`: for the call, the model and the causal LM see SGLang's
  pipeline group as a non-last stage (`NonLastStage`), so both return through SGLang's own stage exit
  right after the loop: no final norm, no mHC head, never `lm_head` (a `PPMissingLayer` on P). P samples
  nothing: the forward hands the model runner zero logits, one row per request (the placeholder token
  SGLang's prefill flow needs, never sent).
Bounded replay must be off on P (shared/cuda_guards.py): a late-layer tail would hand this loop layer L's
replay rows, and the hook refuses one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import torch

from ..shared.pool_dump import log_forward
from .role import PrefillRole

CUT_ATTR = "_sglang_asym_prefill_cut"
ROOMS_ATTR = "_sglang_asym_room_of"
CUT_MODE = "extend-cut"  # the forward log's mode for P's cut: layers 0..L-1 whole, layer L's KV path only


class PrefillCutError(RuntimeError):
    """The model cannot run P's cut (names what is wrong)."""


class NonLastStage:
    """SGLang's pipeline group as P's forward sees it: every attribute SGLang's, but not the last stage."""

    is_last_rank = False

    def __init__(self, group: Any) -> None:
        self._group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)


def cut_of(model: Any) -> PrefillRole | None:
    """The role whose cut is bound to this causal LM, or None."""
    return getattr(model, CUT_ATTR, None)


def set_room_lookup(causal_lm: Any, room_of: Callable[[int], int | None]) -> None:
    """Names each request's bootstrap room in the forward log, where this process knows it by req slot (the CPU
    engine's schedule records); elsewhere the log's rooms stay None."""
    setattr(causal_lm.model, ROOMS_ATTR, room_of)


def _request_rows(positions: torch.Tensor, forward_batch: Any,
                  room_of: Callable[[int], int | None] | None) -> list[tuple[int | None, int, int]]:
    """(room, start, end) per request of an extend batch, for the forward log."""
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    if not lens:
        return []
    slots = forward_batch.req_pool_indices.tolist() if room_of is not None else [None] * len(lens)
    out, at = [], 0
    for n, slot in zip(lens, slots):
        n = int(n)
        if n:
            start = int(positions[at])
            out.append((None if slot is None else room_of(int(slot)), start, start + n))
        at += n
    return out


def write_last_source_kv(model: Any, layer_id: int, residual: torch.Tensor, pre: torch.Tensor,
                         positions: torch.Tensor, forward_batch: Any) -> None:
    """Layer `layer_id`'s compressed KV and index keys from the loop's final mHC state."""
    import sglang.srt.models.deepseek_v4 as dsv4
    from sglang.srt.models import deepseek_v4_mhc as mhc

    source = model.layers[layer_id]
    x = mhc.combine(source.attn_hc, mhc.HcState(residual, pre))
    dsv4.get_attn_backend().forward_low_ratio_sources(
        layer=source.self_attn, x=x, q_lora=None, positions=positions, forward_batch=forward_batch,
        run_indexer=False)


def cut_layer_loop(model: Any, role: PrefillRole) -> Callable[..., Any]:
    """The wrapper of `model._forward_layers_hc_pre_from_prev` (bound to the DeepseekV4Model instance)."""
    sglang_loop = model._forward_layers_hc_pre_from_prev
    last = role.last_kv_source

    def loop(positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: Any, *args: Any,
             **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
        started = time.perf_counter()
        end = model.end_layer
        model.end_layer = last
        try:
            residual, pre, tail = sglang_loop(positions, hidden_states, forward_batch, *args, **kwargs)
        finally:
            model.end_layer = end
        if tail is not None:
            raise PrefillCutError("SGLang ran a late-layer tail on the asym-prefill model (bounded replay is on): "
                                  "pass --no-enable-decoder-swa-bounded-replay")
        if pre is None:
            raise PrefillCutError("SGLang's layer loop returned no mHC pre weights: the pinned SGLang changed")
        write_last_source_kv(model, last, residual, pre, positions, forward_batch)
        log_forward("prefill", CUT_MODE, [*range(model.start_layer, last), last],
                    _request_rows(positions, forward_batch, getattr(model, ROOMS_ATTR, None)),
                    time.perf_counter() - started)
        return residual, pre, None

    return loop


@contextlib.contextmanager
def non_last_stage(*modules: Any) -> Iterator[None]:
    """For the call: each module's `pp_group` seen as a non-last pipeline stage (restored after)."""
    groups = [module.pp_group for module in modules]
    try:
        for module, group in zip(modules, groups):
            module.pp_group = NonLastStage(group)
        yield
    finally:
        for module, group in zip(modules, groups):
            module.pp_group = group


def cut_forward(causal_lm: Any, vocab_size: int) -> Callable[..., Any]:
    """The wrapper of the causal LM's `forward`: SGLang's forward up to its stage exit, then zero logits."""
    sglang_forward = causal_lm.forward

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        with non_last_stage(causal_lm, causal_lm.model):
            sglang_forward(input_ids, positions, forward_batch, *args, **kwargs)
        requests = int(forward_batch.batch_size)
        return LogitsProcessorOutput(next_token_logits=torch.zeros(requests, vocab_size, device=input_ids.device))

    return forward


def install_prefill_cut(causal_lm: Any, role: PrefillRole) -> Any:
    """Binds P's cut to a causal LM built under prefill/model.truncated_construction. Idempotent."""
    if cut_of(causal_lm) is not None:
        return causal_lm
    model = causal_lm.model
    if model.end_layer != role.last_kv_source + 1:
        raise PrefillCutError("install_prefill_cut needs the truncated prefill model (layers [0, L + 1))")
    if not getattr(model, "hc_pre_from_prev_sublayer", False):
        raise PrefillCutError("the model does not run V4.1's hc_pre_from_prev layer loop the cut is written for")
    model._forward_layers_hc_pre_from_prev = cut_layer_loop(model, role)
    causal_lm.forward = cut_forward(causal_lm, causal_lm.config.vocab_size)
    setattr(causal_lm, CUT_ATTR, role)
    return causal_lm
