"""Indexer: scores compressed rows for each query and keeps the top-k.

score(t, j) = sum_h w_h(t) * relu(q_h(t) . k_j), rows a query cannot see yet are -inf. The last KV
source also keeps, per query, the top `candidate_topk_blocks` blocks of `candidate_block_size`
rows (the block holding the newest visible row pinned); later (reindex) layers score only inside
those candidates. Reuse layers take the latest selection unchanged."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..config import V41Config
from .primitives import RMSNorm, apply_rope
from .quant import Quantizer


class Indexer(nn.Module):
    def __init__(self, cfg: V41Config, dtype: torch.dtype, owns_keys: bool, has_query: bool = True) -> None:
        super().__init__()
        self.heads, self.dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.block_size, self.topk_blocks = cfg.candidate_block_size, cfg.candidate_topk_blocks
        if has_query:
            self.wq_b = nn.Linear(cfg.q_lora_rank, self.heads * self.dim, bias=False, dtype=dtype)
            self.weights_proj = nn.Linear(cfg.hidden_size, self.heads, bias=False, dtype=dtype)
        if owns_keys:
            self.wk = nn.Linear(cfg.head_dim, self.dim, bias=False, dtype=dtype)
            self.k_norm = RMSNorm(self.dim, cfg.rms_norm_eps, dtype)

    def queries(self, x: torch.Tensor, q_latent: torch.Tensor, angles: torch.Tensor,
                quant: Quantizer) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row index queries [T, heads, dim] and head weights [T, heads] (row-wise: batchable)."""
        q = quant.index(apply_rope(self.wq_b(q_latent).unflatten(-1, (self.heads, self.dim)), angles))
        w = self.weights_proj(x) * (self.dim ** -0.5 * self.heads ** -0.5)
        return q, w

    def scores(self, q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """[T, rows] scores of one request's queries over its keys; -inf where row >= visible[t]."""
        s = torch.einsum("thd,rd->thr", q, keys)
        s = (s.relu() * w.unsqueeze(-1)).sum(dim=1)
        allowed = torch.arange(keys.shape[0], device=q.device) < visible.unsqueeze(-1)
        return s.masked_fill(~allowed, -torch.inf)

    def candidate_blocks(self, scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Boolean [T, rows]: rows inside each query's kept blocks (and visible)."""
        rows = scores.shape[-1]
        blocks = F.pad(scores, (0, -rows % self.block_size), value=-torch.inf)
        blocks = blocks.unflatten(-1, (-1, self.block_size)).amax(dim=-1)
        newest = ((visible - 1) // self.block_size).unsqueeze(-1)
        ids = torch.arange(blocks.shape[-1], device=scores.device)
        blocks = blocks.masked_fill(ids == newest, torch.inf)
        top = blocks.topk(min(self.topk_blocks, blocks.shape[-1]), dim=-1)
        keep = torch.zeros_like(blocks, dtype=torch.bool).scatter(-1, top.indices, top.values > -torch.inf)
        keep = keep.repeat_interleave(self.block_size, dim=-1)[..., :rows]
        return keep & torch.isfinite(scores)

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """[T, k] selected row ids in ascending order, -1 where fewer than k rows are visible."""
        if scores.shape[-1] == 0:
            return torch.empty(scores.shape[0], 0, dtype=torch.long, device=scores.device)
        top = scores.topk(min(self.topk, scores.shape[-1]), dim=-1, sorted=False)
        ids = top.indices.sort(dim=-1).values
        return torch.where(torch.isfinite(scores.gather(-1, ids)), ids, -1)
