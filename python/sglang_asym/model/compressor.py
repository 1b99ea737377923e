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

    def latents(self, x: torch.Tensor, start: int, cache: RequestCache, owner: int) -> tuple[torch.Tensor, int]:
        """Unrotated latent rows completed by tokens [start, start+T), and the first new row id."""
        if self.ratio == 1:
            return self.norm(linear(x, self.wkv.weight)), start
        v = F.linear(x.float(), self.wkv.weight.float())
        g = F.linear(x.float(), self.wgate.weight.float())
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
        v = v[: 2 * pairs].unflatten(0, (pairs, 2))
        g = g[: 2 * pairs].unflatten(0, (pairs, 2))
        pooled = (v * g.softmax(dim=1)).sum(dim=1).to(x.dtype)
        return self.norm(pooled), first_token // 2


def write_compressed_rows(compressor: Compressor, keys: nn.Module, rope: RopeTable, quant: Quantizer,
                          x: torch.Tensor, start: int, cache: RequestCache, owner: int) -> None:
    """Run owner's compressor over the chunk's attention inputs and append its finished rows.
    `keys` is the owner's indexer (its wk and k_norm turn latent rows into index keys)."""
    latent, first_row = compressor.latents(x, start, cache, owner)
    if latent.shape[0] == 0:
        return
    row_positions = (torch.arange(latent.shape[0], device=x.device) + first_row) * compressor.ratio
    angles = rope.angles(row_positions)
    kv_rows = cache.rows(kv_group(owner))
    if kv_rows.end != first_row:
        raise RuntimeError(f"layer {owner}: compressed rows out of order ({kv_rows.end} stored, next {first_row})")
    kv_rows.append(quant.main_kv(apply_rope(latent, angles)))
    cache.rows(index_group(owner)).append(quant.index(apply_rope(keys.k_norm(keys.wk(latent)), angles)))
