"""A transformer block (attention + MoE sublayers joined by mHC), and the prefill role's stripped
last-KV-source block that only writes compressed rows and index keys."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..config import V41Config
from ..layer_plan import LayerInfo
from .attention import Attention
from .batch import RowBatch
from .compressor import Compressor, write_compressed_rows
from .indexer import Indexer
from .mhc import collapse, expand, site_mix
from .moe import MoE
from .primitives import RMSNorm, RopeTable
from .quant import Quantizer


def _mix_params(cfg: V41Config) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    width = cfg.hc_mult * (cfg.hc_mult + 2)
    return (nn.Parameter(torch.zeros(width, cfg.hc_mult * cfg.hidden_size), requires_grad=False),
            nn.Parameter(torch.zeros(width), requires_grad=False),
            nn.Parameter(torch.ones(3), requires_grad=False))


class MixedSublayers(nn.Module):
    """The norms and mHC mixes of an attention and an FFN sublayer (a layer's block and a draft block), and
    the pass through both; the subclass adds `attn` and `ffn`."""

    def __init__(self, cfg: V41Config, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = _mix_params(cfg)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = _mix_params(cfg)

    def _mix(self, streams: torch.Tensor, site: str):
        cfg = self.cfg
        return site_mix(streams, getattr(self, f"hc_{site}_fn"), getattr(self, f"hc_{site}_base"),
                        getattr(self, f"hc_{site}_scale"), cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)

    def sublayers(self, streams: torch.Tensor, pre: torch.Tensor,
                  attend: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`attend` runs the attention sublayer on its normed input."""
        attn_mix = self._mix(streams, "attn")
        streams = expand(attend(self.attn_norm(collapse(streams, pre))), streams, attn_mix)
        ffn_mix = self._mix(streams, "ffn")
        out = self.ffn(self.ffn_norm(collapse(streams, attn_mix.pre)))
        return expand(out, streams, ffn_mix), ffn_mix.pre


class Block(MixedSublayers):
    def __init__(self, cfg: V41Config, info: LayerInfo, dtype: torch.dtype) -> None:
        super().__init__(cfg, dtype)
        self.info = info
        self.attn = Attention(cfg, info, dtype)
        self.ffn = MoE(cfg, dtype)

    def forward(self, streams: torch.Tensor, pre: torch.Tensor, batch: RowBatch,
                quant: Quantizer) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sublayers(streams, pre, lambda x: self.attn(x, batch, quant))

    def write_kv_source_rows(self, streams: torch.Tensor, pre: torch.Tensor, batch: RowBatch,
                             quant: Quantizer) -> None:
        """Only this KV owner's compressed rows and index keys for the batch's rows (what KVPathBlock computes):
        bounded replay's prefix pass writes them for every prompt row without the layer's attention or FFN."""
        if not self.info.owns_kv:
            raise ValueError(f"layer {self.info.index} owns no compressed KV")
        x = self.attn_norm(collapse(streams, pre))
        write_compressed_rows(self.attn.compressor, self.attn.indexer, self.attn.rope, quant, x, batch,
                              self.info.index)


class _KVPathAttention(nn.Module):
    def __init__(self, cfg: V41Config, info: LayerInfo, dtype: torch.dtype) -> None:
        super().__init__()
        self.compressor = Compressor(cfg, info.ratio, dtype)
        self.indexer = Indexer(cfg, dtype, owns_keys=True, has_query=False)


class KVPathBlock(nn.Module):
    """The last KV source as the prefill role holds it: attn_norm, compressor, index-key path."""

    def __init__(self, cfg: V41Config, info: LayerInfo, dtype: torch.dtype) -> None:
        super().__init__()
        self.info = info
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.attn = _KVPathAttention(cfg, info, dtype)
        self.rope = RopeTable(cfg, compressed=True)

    def forward(self, streams: torch.Tensor, pre: torch.Tensor, batch: RowBatch, quant: Quantizer) -> None:
        x = self.attn_norm(collapse(streams, pre))
        write_compressed_rows(self.attn.compressor, self.attn.indexer, self.rope, quant, x, batch, self.info.index)
