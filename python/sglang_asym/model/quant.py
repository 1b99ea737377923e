"""The model's view of cache quantization: 'none' (exact float math), 'release' (FP8 window KV,
NVFP4 compressed KV, MXFP4 indexer queries and keys) or 'v4' (both KV caches in SGLang's V4 row),
applied right after RoPE as released."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import CACHE_QUANT_MODES, CacheQuant, quantize_index, quantize_main_kv, quantize_swa_kv


@dataclass(frozen=True)
class Quantizer:
    mode: str = "none"
    rope_channels: int = 64  # the config's qk_rope_head_dim (the V4 row keeps them in bf16)

    def __post_init__(self) -> None:
        if self.mode not in CACHE_QUANT_MODES:
            raise ValueError(f"cache quant must be one of {CACHE_QUANT_MODES}, got {self.mode!r}")

    @property
    def _quant(self) -> CacheQuant:
        return CacheQuant(mode=self.mode, rope_channels=self.rope_channels)

    def swa_kv(self, x: torch.Tensor) -> torch.Tensor:
        return quantize_swa_kv(x, self._quant)

    def main_kv(self, x: torch.Tensor) -> torch.Tensor:
        return quantize_main_kv(x, self._quant)

    def index(self, x: torch.Tensor) -> torch.Tensor:
        return quantize_index(x, self._quant)
