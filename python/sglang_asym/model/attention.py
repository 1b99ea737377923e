"""One layer's attention over a chunk of tokens, reading and extending the request's caches.

A query at position p attends its own layer's window keys k in [max(floor, p - W + 1), p] and, on
compressed layers, the rows of its KV source that the latest index selection picked for it; one
softmax over both plus a per-head sink logit that only enters the denominator. K = V (one latent
head); the output is un-roped, projected per group by wo_a, then by wo_b."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..cache import RequestCache, index_group, kv_group, swa_group
from ..cache.request import ROLLBACK_MARGIN_ROWS
from ..config import V41Config
from ..layer_plan import LayerInfo, Role
from .compressor import Compressor, write_compressed_rows
from .indexer import Indexer
from .primitives import RMSNorm, RopeTable, apply_rope, grouped_linear
from .quant import Quantizer

QUERY_TILE = 256  # queries per attention/indexer tile: bounds the [tile, heads, keys] temporaries


@dataclass
class ChunkState:
    """Per-forward state that flows from layer to layer (never cached across forwards)."""

    positions: torch.Tensor  # [T] absolute positions of the chunk's tokens
    selection: torch.Tensor | None = None  # [T, k] row ids chosen by the latest index source (-1: none)
    candidates: torch.Tensor | None = None  # [T, rows] candidate mask from the last KV source


class Attention(nn.Module):
    def __init__(self, cfg: V41Config, info: LayerInfo, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.info = cfg, info
        heads, hd = cfg.num_attention_heads, cfg.head_dim
        self.wq_a = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, dtype)
        self.wq_b = nn.Linear(cfg.q_lora_rank, heads * hd, bias=False, dtype=dtype)
        self.wkv = nn.Linear(cfg.hidden_size, hd, bias=False, dtype=dtype)
        self.kv_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype)
        self.wo_a = nn.Linear(heads * hd // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, bias=False, dtype=dtype)
        self.wo_b = nn.Linear(cfg.o_groups * cfg.o_lora_rank, cfg.hidden_size, bias=False, dtype=dtype)
        self.attn_sink = nn.Parameter(torch.zeros(heads, dtype=torch.float32), requires_grad=False)
        if info.owns_kv:
            self.compressor = Compressor(cfg, info.ratio, dtype)
        if info.has_indexer:
            self.indexer = Indexer(cfg, dtype, owns_keys=info.owns_kv)
        self.rope = RopeTable(cfg, compressed=info.ratio > 0)

    def forward(self, x: torch.Tensor, state: ChunkState, cache: RequestCache, quant: Quantizer) -> torch.Tensor:
        cfg, info = self.cfg, self.info
        pos = state.positions
        angles = self.rope.angles(pos)
        q_latent = self.q_norm(self.wq_a(x))
        q = apply_rope(self.wq_b(q_latent).unflatten(-1, (cfg.num_attention_heads, cfg.head_dim)), angles)
        window_rows = cache.rows(swa_group(info.index))
        if window_rows.end != int(pos[0]):
            raise RuntimeError(f"layer {info.index}: window rows end at {window_rows.end}, chunk starts at {int(pos[0])}")
        window_rows.append(quant.swa_kv(apply_rope(self.kv_norm(self.wkv(x)), angles)))

        compressed = None
        if info.ratio:
            if info.owns_kv:
                write_compressed_rows(self.compressor, self.indexer, self.rope, quant, x, int(pos[0]), cache, info.index)
            compressed = cache.rows(kv_group(info.kv_source)).read()
            if info.has_indexer:
                self._index(x, q_latent, angles, state, cache, quant)
            if state.selection is None:
                raise RuntimeError(f"layer {info.index} reuses a selection but no index source ran before it")
        attended = torch.cat([
            self._attend(q[a : a + QUERY_TILE], pos[a : a + QUERY_TILE], window_rows, compressed,
                         None if compressed is None else state.selection[a : a + QUERY_TILE], cache)
            for a in range(0, x.shape[0], QUERY_TILE)
        ])
        attended = apply_rope(attended, angles, inverse=True)
        grouped = grouped_linear(attended.reshape(x.shape[0], cfg.o_groups, -1), self.wo_a.weight, cfg.o_groups)
        out = self.wo_b(grouped.flatten(1))
        # Only the last window stays (the next chunk's first query needs keys from p - W + 1 on), plus a
        # margin for rolling back a rejected speculative suffix.
        window_rows.drop_before(int(pos[-1]) + 2 - cfg.sliding_window - ROLLBACK_MARGIN_ROWS)
        return out

    def _index(self, x, q_latent, angles, state: ChunkState, cache: RequestCache, quant: Quantizer) -> None:
        info, cfg = self.info, self.cfg
        keys = cache.rows(index_group(info.kv_source)).read()
        visible = (state.positions + 1) // info.ratio
        selections, candidates = [], []
        for a in range(0, x.shape[0], QUERY_TILE):
            b = a + QUERY_TILE
            scores = self.indexer.scores(x[a:b], q_latent[a:b], angles[a:b], keys, visible[a:b], quant)
            if info.role is Role.FULL_CANDIDATE:
                candidates.append(self.indexer.candidate_blocks(scores, visible[a:b]))
            elif info.index > cfg.candidate_source_layer_id:
                if state.candidates is None:
                    raise RuntimeError(f"reindex layer {info.index} needs candidates from layer {cfg.candidate_source_layer_id}")
                scores = scores.masked_fill(~state.candidates[a:b], -torch.inf)
            selections.append(self.indexer.select(scores))
        state.selection = torch.cat(selections)
        if candidates:
            state.candidates = torch.cat(candidates)

    def _attend(self, q: torch.Tensor, pos: torch.Tensor, window_rows, compressed, selection,
                cache: RequestCache) -> torch.Tensor:
        cfg, layer = self.cfg, self.info.index
        first, last = int(pos[0]), int(pos[-1])
        floor = cache.swa_floor.get(layer, 0)
        need = max(floor, first - cfg.sliding_window + 1, 0)
        if window_rows.start > need:
            raise RuntimeError(f"layer {layer}: window rows from {need} are needed but the cache starts at "
                               f"{window_rows.start} (no floor covers them)")
        keys = window_rows.read(need, last + 1)
        key_pos = torch.arange(need, last + 1, device=q.device)
        low = torch.clamp(pos - cfg.sliding_window + 1, min=floor)
        allowed = (key_pos >= low.unsqueeze(1)) & (key_pos <= pos.unsqueeze(1))
        scale = cfg.head_dim ** -0.5
        qf = q.float()
        parts = [torch.einsum("thd,sd->ths", qf, keys.float()).mul(scale)
                 .masked_fill(~allowed.unsqueeze(1), -torch.inf)]
        if compressed is not None:
            picked = compressed[selection.clamp(min=0)].float() if selection.shape[-1] else \
                compressed.new_zeros(q.shape[0], 0, cfg.head_dim).float()
            parts.append(torch.einsum("thd,tkd->thk", qf, picked).mul(scale)
                         .masked_fill((selection < 0).unsqueeze(1), -torch.inf))
        parts.append(self.attn_sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1))
        probs = torch.cat(parts, dim=-1).softmax(dim=-1)
        n_keys = keys.shape[0]
        out = torch.einsum("ths,sd->thd", probs[..., :n_keys], keys.float())
        if compressed is not None:
            out = out + torch.einsum("thk,tkd->thd", probs[..., n_keys:-1], picked)
        return out.to(q.dtype)
