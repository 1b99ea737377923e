"""The whole decode forward (attention included) as one static-shape, CUDA-graph capturable function.

Embedding, every layer's attention and MoE, and the head: one CUDA graph per batch bucket, verify
width and context capacity. The same function runs a window step (W = 128 rows per slot, the request's
final prompt rows on top of its prefix).

A step of B request slots x W rows (W = 1 + k for decode; N = B * W rows, request b in rows [b*W, b*W + W))
reads its caches only through static index tensors the host filled before the replay
(`decode_plan.DecodeStep`): flat slot ids into each pool's storage viewed as [pages * page_rows, ...].
Per layer:
  window      the new rows are scattered at their reserved slots, then each slot's S = window + W - 1
              keys are gathered through its window table (key positions -1 where a key is absent) and
              masked by query position, the layer's floor and row validity;
  compressor  (owner layers) every row computes a candidate compressed row (ratio 2: paired with the
              previous row, or with the held tail for the first row); only rows that complete one
              (`done`) write it, at a reserved slot, into the main-KV and index-key pools;
  indexer     scores over C gathered index keys (rows not yet visible are -inf), candidate blocks
              and top-k at fixed k = min(index_topk, C); absent picks are -1 and masked;
  softmax     over window keys, picked compressed rows and the sink, as `Attention._attend_padded`.
Rows that must not write (padding, or no row completed) scatter the current value of a sink slot
that no real row writes back onto itself, so they never change a stored row. Everything is tensor
ops of fixed shape with no host sync: the function is CUDA-graph capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..cache import CacheSet, index_group, kv_group, swa_group
from ..layer_plan import Role
from .primitives import apply_rope, grouped_linear
from .segments import SegmentProgram

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class DecodeShape:
    batch: int  # request slots
    width: int  # rows per slot (1 + k)
    context: int  # compressed rows each slot can read (C), per KV source

    @property
    def rows(self) -> int:
        return self.batch * self.width


def context_capacity(rows: int, minimum: int = 64) -> int:
    """The context bucket holding `rows` compressed rows: a power of two, at least `minimum`."""
    return max(minimum, 1 << max(rows - 1, 0).bit_length())


def window_keys(window: int, width: int) -> int:
    """Window keys one slot reads: from its first query's window start to its last row."""
    return window + width - 1


# The static inputs of the decode forward, in call order (L layers, O KV owners, O2 ratio-2 owners,
# B slots, W rows per slot, N = B * W, S window keys, C context rows):
INPUT_NAMES = (
    "tokens", "positions", "valid",  # [N]: pad token / position 0 / False on padding rows
    "win_slots", "win_kpos",  # [L, B, S]: each window key's flat slot and position (-1: absent)
    "win_floor", "win_write",  # [L, B] the layer's floor; [L, N] where each row's window KV goes
    "kv_write", "idx_write", "done",  # [O, N]: where a completed compressed row / index key goes; completes
    "kv_read", "idx_read",  # [O, B, C]: flat slots of compressed rows / index keys 0 .. C-1
    "tail",  # [O2, B, 2, head_dim] fp32: each slot's held compressor (value, gate), zeros if none
)


def kv_owners(program: SegmentProgram) -> tuple[int, ...]:
    return tuple(b.info.index for b in program.blocks if b.info.owns_kv)


def ratio2_owners(program: SegmentProgram) -> tuple[int, ...]:
    return tuple(b.info.index for b in program.blocks if b.info.owns_kv and b.info.ratio > 1)


def scatter_rows(flat: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, keep: torch.Tensor) -> None:
    """flat[slots[r]] = values[r] where keep[r]; elsewhere the slot's current value is written back
    (the host points every such row at one sink slot that no kept row writes)."""
    old = flat[slots]
    mask = keep.view(-1, *([1] * (values.ndim - 1)))
    flat.index_copy_(0, slots, torch.where(mask, values.to(flat.dtype), old))


class DecodeForward:
    """The decode forward of one shape over one cache set's pools; call with `INPUT_NAMES` tensors.
    Returns (logits [N, V] fp32, the captured layers' stream means [N, D] each, then per ratio-2
    owner its compressor values and gates [N, head_dim] fp32, which the host keeps as tail/journal)."""

    def __init__(self, program: SegmentProgram, cache_set: CacheSet, shape: DecodeShape,
                 capture: tuple[int, ...] = ()) -> None:
        if program.moe != "static":
            raise ValueError("the decode graph needs the capture-safe MoE (moe='static')")
        self.program, self.cache_set, self.shape, self.capture = program, cache_set, shape, tuple(capture)
        self.model = program.model
        self.cfg = self.model.cfg
        # Cache quantization without its host-side refusals; the runner checks the logits after a replay.
        self.quant = self.model.quant.capture_safe()
        self.names = INPUT_NAMES
        self.owners2 = ratio2_owners(program)
        self.owner_at = {o: j for j, o in enumerate(kv_owners(program))}
        self.tail_at = {o: j for j, o in enumerate(self.owners2)}
        self.layer_at = {b.info.index: j for j, b in enumerate(program.blocks)}
        self.flat = {name: pool.storage.view(-1, *pool.spec.row_shape) for name, pool in cache_set.pools.items()}

    def __call__(self, *inputs: torch.Tensor) -> Tensors:
        if len(inputs) != len(self.names):
            raise ValueError(f"decode forward takes {len(self.names)} inputs, got {len(inputs)}")
        t = dict(zip(self.names, inputs))
        program = self.program
        carry = program.first(t["tokens"])
        state: dict[str, torch.Tensor] = {}
        features, pairs = [], {}
        hidden = None
        for i, block in enumerate(program.blocks):
            streams, mix_pre, mix_post, mix_comb, x = carry
            if block.info.index in self.capture:
                features.append(streams.float().mean(dim=1).to(streams.dtype))
            attn_out = self._attention(block, x, t, state, pairs)
            inputs_i = (streams, mix_pre, mix_post, mix_comb, attn_out)
            if i + 1 < program.num_layers:
                carry = program.between(i)(*inputs_i)
            else:
                (hidden,) = program.last(*inputs_i)
        logits = F.linear(hidden.float(), self.model.head.weight)
        extra = [tensor for o in self.owners2 for tensor in pairs[o]]
        return (logits, *features, *extra)

    # ---- one layer's attention -----------------------------------------------------------------
    def _attention(self, block, x: torch.Tensor, t: dict, state: dict, pairs: dict) -> torch.Tensor:
        attn, info, cfg, quant = block.attn, block.info, self.cfg, self.quant
        B, W = self.shape.batch, self.shape.width
        i, li = info.index, self.layer_at[info.index]
        heads, hd = cfg.num_attention_heads, cfg.head_dim
        pos, valid = t["positions"], t["valid"]
        angles = attn.rope.angles(pos)
        q_latent = attn.q_norm(attn.wq_a(x))
        q = apply_rope(attn.wq_b(q_latent).unflatten(-1, (heads, hd)), angles)
        kv = quant.swa_kv(apply_rope(attn.kv_norm(attn.wkv(x)), angles))
        window = self.flat[swa_group(i)]
        scatter_rows(window, t["win_write"][li], kv, valid)  # written before the keys are read
        picked = selection = None
        if info.ratio:
            if info.owns_kv:
                self._compress(attn, x, t, i, pairs)
            if info.has_indexer:
                self._index(attn, info, x, q_latent, angles, t, state)
            selection = state["selection"]  # [N, k]
            slots = t["kv_read"][self.owner_at[info.kv_source]]  # [B, C]
            rows = slots.gather(1, selection.clamp(min=0).view(B, -1)).view(B, W, -1)
            picked = self.flat[kv_group(info.kv_source)][rows].float()  # [B, W, k, d]
        keys = window[t["win_slots"][li]].float()  # [B, S, d]
        kpos = t["win_kpos"][li].unsqueeze(1)  # [B, 1, S]
        p = pos.view(B, W, 1)
        low = torch.clamp(p - cfg.sliding_window + 1, min=t["win_floor"][li].view(B, 1, 1))
        allowed = (kpos >= low) & (kpos <= p) & valid.view(B, W, 1)
        scale = cfg.head_dim ** -0.5
        qf = q.float().view(B, W, heads, hd)
        parts = [torch.einsum("bthd,bsd->bths", qf, keys).mul(scale).masked_fill(~allowed.unsqueeze(2), -torch.inf)]
        if picked is not None:
            absent = (selection < 0).view(B, W, 1, -1)
            parts.append(torch.einsum("bthd,btkd->bthk", qf, picked).mul(scale).masked_fill(absent, -torch.inf))
        parts.append(attn.attn_sink.float().view(1, 1, -1, 1).expand(B, W, -1, 1))
        probs = torch.cat(parts, dim=-1).softmax(dim=-1)
        n_keys = keys.shape[1]
        out = torch.einsum("bths,bsd->bthd", probs[..., :n_keys], keys)
        if picked is not None:
            out = out + torch.einsum("bthk,btkd->bthd", probs[..., n_keys:-1], picked)
        attended = apply_rope(out.flatten(0, 1).to(q.dtype), angles, inverse=True)
        grouped = grouped_linear(attended.reshape(x.shape[0], cfg.o_groups, -1), attn.wo_a.weight, cfg.o_groups)
        return attn.wo_b(grouped.flatten(1))

    def _compress(self, attn, x: torch.Tensor, t: dict, owner: int, pairs: dict) -> None:
        """Every row's candidate compressed row; rows marked `done` complete one and store it."""
        B, W = self.shape.batch, self.shape.width
        comp, quant, pos = attn.compressor, self.quant, t["positions"]
        v, g = comp.project(x)
        if comp.ratio == 1:
            latent, row_pos = v, pos
        else:
            pairs[owner] = (v, g)
            tail = t["tail"][self.tail_at[owner]]  # [B, 2, d]: the request's held (value, gate), zeros if none
            vb, gb = v.view(B, W, -1), g.view(B, W, -1)
            prev_v = torch.cat((tail[:, 0:1], vb[:, :-1]), dim=1)  # each row's partner: the row before it
            prev_g = torch.cat((tail[:, 1:2], gb[:, :-1]), dim=1)
            latent = comp.pool(torch.stack((prev_v, vb), dim=2).flatten(0, 1),
                               torch.stack((prev_g, gb), dim=2).flatten(0, 1), x.dtype)
            row_pos = pos - 1  # an odd position p completes row (p - 1) / 2, roped at position p - 1
        angles = attn.rope.angles(row_pos)
        j = self.owner_at[owner]
        done = t["done"][j]
        scatter_rows(self.flat[kv_group(owner)], t["kv_write"][j], quant.main_kv(apply_rope(latent, angles)), done)
        keys = quant.index(apply_rope(attn.indexer.k_norm(attn.indexer.wk(latent)), angles))
        scatter_rows(self.flat[index_group(owner)], t["idx_write"][j], keys, done)

    def _index(self, attn, info, x, q_latent, angles, t: dict, state: dict) -> None:
        B, W = self.shape.batch, self.shape.width
        indexer, cfg = attn.indexer, self.cfg
        q, w = indexer.queries(x, q_latent, angles, self.quant)
        keys = self.flat[index_group(info.kv_source)][t["idx_read"][self.owner_at[info.kv_source]]]  # [B, C, dim]
        scores = torch.einsum("bthd,brd->bthr", q.view(B, W, *q.shape[1:]), keys)
        scores = (scores.relu() * w.view(B, W, -1, 1)).sum(dim=2).flatten(0, 1)  # [N, C]
        visible = torch.where(t["valid"], (t["positions"] + 1) // info.ratio, 0)
        allowed = torch.arange(scores.shape[-1], device=scores.device) < visible.unsqueeze(-1)
        scores = scores.masked_fill(~allowed, -torch.inf)
        if info.role is Role.FULL_CANDIDATE:
            state["candidates"] = indexer.candidate_blocks(scores, visible)
        elif info.index > cfg.candidate_source_layer_id:
            scores = scores.masked_fill(~state["candidates"], -torch.inf)
        state["selection"] = indexer.select(scores)
