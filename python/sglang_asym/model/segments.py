"""The model's forward cut at attention: static-shape segments of row-wise work between eager attention.

For a forward of T rows (real rows plus padding) and L layers:
  first(tokens)                -> layer 0's input streams, its attention-site mix, attention input x
  between(i)(carry, attn_out)  -> layer i's residual write-back, its MoE sublayer, then layer i+1's
                                  attention-site mix and attention input
  last(carry, attn_out)        -> the last layer's write-back and MoE, collapsed and final-normed [T, D]
  head(hidden, rows)           -> fp32 logits of the picked rows [R, V]
where carry = (streams [T, S, D], mix pre [T, S], mix post [T, S], mix comb [T, S, S]). Attention
(which reads and extends the paged caches) runs per request between segments. Every segment is the
reference Block's math in the same order, row-wise (no op mixes rows), free of host syncs, and its
output shapes depend only on T: a CUDA graph captures it once per row count.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .block import Block
from .mhc import Mix, collapse, expand
from .model import V41Model
from .static_moe import MoEPath, StackedExperts, moe_path_for_rows, stack_experts, static_moe

Tensors = tuple[torch.Tensor, ...]
SegmentFn = Callable[..., Tensors]


class SegmentProgram:
    """The segment functions of one full-role V41Model. `moe='static'` keeps every segment
    capture-safe; `moe='routed'` calls the reference MoE (data-dependent: eager execution only)."""

    def __init__(self, model: V41Model, moe: str = "static") -> None:
        if model.role != "full":
            raise ValueError(f"segments need the full-role model, got role {model.role!r}")
        if moe not in ("static", "routed"):
            raise ValueError(f"moe must be 'static' or 'routed', got {moe!r}")
        self.model, self.moe = model, moe
        self.blocks: list[Block] = list(model.layers)
        self.num_layers = len(self.blocks)
        self._stacks: list[StackedExperts] = [stack_experts(b.ffn) for b in self.blocks] if moe == "static" else []
        self._between = [self._make_between(i) for i in range(self.num_layers - 1)]

    @property
    def capture_safe(self) -> bool:
        return self.moe == "static"

    def check_weights(self) -> None:
        """Raise if the model's expert parameters no longer live in the stacks (moved or replaced)."""
        for block, stack in zip(self.blocks, self._stacks):
            if not stack.still_backs(block.ffn):
                raise RuntimeError(f"layer {block.info.index}: expert weights were replaced or moved after the "
                                   "segment program stacked them; build a new runner for this model")

    def moe_path(self, rows: int) -> MoEPath | None:
        if self.moe == "routed":
            return None
        cfg = self.model.cfg
        return moe_path_for_rows(rows, cfg.n_routed_experts, cfg.num_experts_per_tok)

    # ---- the pieces (shared by every segment) ----------------------------------------------------
    def _ffn(self, i: int, x: torch.Tensor) -> torch.Tensor:
        block = self.blocks[i]
        path = self.moe_path(x.shape[0])
        if path is None:
            return block.ffn(x)
        return static_moe(block.ffn, self._stacks[i], x, path)

    def _enter(self, i: int, streams: torch.Tensor, pre: torch.Tensor) -> Tensors:
        """Layer i's attention-site mix and attention input from its input streams and `pre`."""
        block = self.blocks[i]
        mix = block._mix(streams, "attn")
        x = block.attn_norm(collapse(streams, pre))
        return streams, mix.pre, mix.post, mix.comb, x

    def _leave(self, i: int, streams, mix_pre, mix_post, mix_comb, attn_out) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i after attention: write the attention output back, run the MoE sublayer."""
        block = self.blocks[i]
        streams = expand(attn_out, streams, Mix(mix_pre, mix_post, mix_comb))
        ffn_mix = block._mix(streams, "ffn")
        out = self._ffn(i, block.ffn_norm(collapse(streams, mix_pre)))
        return expand(out, streams, ffn_mix), ffn_mix.pre

    # ---- segments -------------------------------------------------------------------------------
    def first(self, tokens: torch.Tensor) -> Tensors:
        model = self.model
        streams = model.embed(tokens).unsqueeze(1).expand(-1, model.cfg.hc_mult, -1).contiguous()
        pre = torch.zeros(tokens.shape[0], model.cfg.hc_mult, dtype=torch.float32, device=tokens.device)
        pre[:, 0] = 1
        return self._enter(0, streams, pre)

    def between(self, i: int) -> SegmentFn:
        if not 0 <= i < self.num_layers - 1:
            raise IndexError(f"between-segment {i} does not exist ({self.num_layers} layers)")
        return self._between[i]

    def _make_between(self, i: int) -> SegmentFn:
        def segment(streams, mix_pre, mix_post, mix_comb, attn_out) -> Tensors:
            streams, pre = self._leave(i, streams, mix_pre, mix_post, mix_comb, attn_out)
            return self._enter(i + 1, streams, pre)

        return segment

    def last(self, streams, mix_pre, mix_post, mix_comb, attn_out) -> Tensors:
        streams, pre = self._leave(self.num_layers - 1, streams, mix_pre, mix_post, mix_comb, attn_out)
        return (self.model.norm(collapse(streams, pre)),)

    def head(self, hidden: torch.Tensor, rows: torch.Tensor) -> Tensors:
        return (nn.functional.linear(hidden[rows].float(), self.model.head.weight),)
