"""KV compressor of an owner layer and its index-key path.

Ratio 1: row p = RMSNorm(wkv x_p). Ratio 2: for the pair (2j, 2j+1), v = wkv x and g = wgate x in
fp32, row j = RMSNorm(sum over the pair of softmax(g) * v). A pair's row exists only once both
tokens have been seen; an unpaired trailing token waits in the request's compressor tail.
Rows are stored roped (at position ratio*j) and cache-quantized (main KV: nvfp4; index keys:
mxfp4, after wk and k_norm)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..cache import RequestCache, index_group, kv_group
from ..config import V41Config
from .batch import RowBatch
from .primitives import RMSNorm, RopeTable, apply_rope, linear
from .quant import Quantizer


class Compressor(nn.Module):
    def __init__(self, cfg: V41Config, ratio: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.ratio = ratio
        self.wkv = nn.Linear(cfg.hidden_size, cfg.head_dim, bias=False, dtype=torch.float32)
        self.norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype)
        if ratio > 1:
            self.wgate = nn.Linear(cfg.hidden_size, cfg.head_dim, bias=False, dtype=torch.float32)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Row-wise part: ratio 1 -> (latent rows, None); ratio 2 -> fp32 (values, gates) per token."""
        if self.ratio == 1:
            return self.norm(linear(x, self.wkv.weight)), None
        return F.linear(x.float(), self.wkv.weight.float()), F.linear(x.float(), self.wgate.weight.float())

    def pair_up(self, v: torch.Tensor, g: torch.Tensor, start: int, cache: RequestCache,
                owner: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Ratio 2, one request's tokens [start, start+T): join the held tail, keep the new tail and the
        rollback journal; returns the completed pairs' values and gates [pairs, 2, head_dim] and the
        first new row id."""
        tail = cache.tail(owner)
        if tail is not None:
            if start % 2 != 1:
                raise RuntimeError(f"layer {owner}: a compressor tail exists but the chunk starts at even {start}")
            v, g = torch.cat((tail[0:1], v)), torch.cat((tail[1:2], g))
        elif start % 2:
            raise RuntimeError(f"layer {owner}: chunk starts at odd position {start} but no compressor tail is held")
        first_token = start - (1 if tail is not None else 0)
        cache.record_pair_inputs(owner, first_token, v, g)
        pairs = v.shape[0] // 2
        cache.set_tail(owner, torch.stack((v[2 * pairs], g[2 * pairs])) if v.shape[0] % 2 else None)
        return v[: 2 * pairs].unflatten(0, (pairs, 2)), g[: 2 * pairs].unflatten(0, (pairs, 2)), first_token // 2

    def pool(self, v: torch.Tensor, g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Completed pairs [pairs, 2, head_dim] (any number of requests') -> normalized latent rows."""
        return self.norm((v * g.softmax(dim=1)).sum(dim=1).to(dtype))


def write_compressed_rows(compressor: Compressor, keys: nn.Module, rope: RopeTable, quant: Quantizer,
                          x: torch.Tensor, batch: RowBatch, owner: int) -> None:
    """Run owner's compressor over a batch's attention inputs and append each request's finished rows.
    `keys` is the owner's indexer (its wk and k_norm turn latent rows into index keys)."""
    v, g = compressor.project(x)
    pieces: list[tuple[RequestCache, int, int]] = []  # (cache, first new row, rows)
    if compressor.ratio == 1:
        latent = v
        for seg in batch.segments:
            pieces.append((seg.cache, seg.start, seg.rows.stop - seg.rows.start))
    else:
        pairs_v, pairs_g = [], []
        for seg in batch.segments:
            pv, pg, first_row = compressor.pair_up(v[seg.rows], g[seg.rows], seg.start, seg.cache, owner)
            pairs_v.append(pv)
            pairs_g.append(pg)
            pieces.append((seg.cache, first_row, pv.shape[0]))
        latent = compressor.pool(torch.cat(pairs_v), torch.cat(pairs_g), x.dtype)
    if latent.shape[0] == 0:
        return
    row_positions = torch.cat([torch.arange(first, first + n, device=x.device) for _, first, n in pieces])
    angles = rope.angles(row_positions * compressor.ratio)
    kv = quant.main_kv(apply_rope(latent, angles))
    index_keys = quant.index(apply_rope(keys.k_norm(keys.wk(latent)), angles))
    offset = 0
    for cache, first_row, n in pieces:
        if n:
            kv_rows = cache.rows(kv_group(owner))
            if kv_rows.end != first_row:
                raise RuntimeError(f"layer {owner}: compressed rows out of order ({kv_rows.end} stored, next {first_row})")
            kv_rows.append(kv[offset : offset + n])
            cache.rows(index_group(owner)).append(index_keys[offset : offset + n])
        offset += n
