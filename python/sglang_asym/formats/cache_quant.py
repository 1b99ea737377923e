"""Which cache gets which format: the model's entry points for cache quantization.

The released model (mode "release") quantizes (then dequantizes) three cache tensors right after
RoPE, over all channels including the rotary ones:
  SWA KV rows         fp8    (ue8m0 scale per `swa_kv_block_size` channels)
  compressed main KV  nvfp4  (e4m3 scale per `main_kv_block_size` channels)
  indexer keys and indexer queries   mxfp4  (ue8m0 scale per `index_block_size` channels)
Mode "v4" stores both KV caches as SGLang's V4 pool layout does (what it picks on an H200): fp8
nope channels with a ue8m0 scale per 64, bf16 rope channels (v4_rows.py); indexer as released.
Mode "none" turns all of them into the identity (the tensor itself is returned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .codec import fake_quantize
from .rows import pack_rows, unpack_rows
from .spec import FORMATS, FormatName, resolve_block_size, row_bytes
from .v4_rows import fake_quantize_v4, pack_v4_rows, unpack_v4_rows, v4_parts

CacheQuantMode = Literal["none", "release", "v4"]
CACHE_QUANT_MODES = ("none", "release", "v4")
V4_ROW = "v4"  # the V4 layout's row (fp8_v4 nope + bf16 rope), not a block format of its own


@dataclass(frozen=True)
class CacheFormat:
    """One row format (a block format at one block size, or the V4 row with its rope channels), with
    its fake-quantizer and row packers. Packed rows are `data || scales`."""

    fmt: FormatName | Literal["v4"]
    block_size: int | None = None  # None: the format's release block size (the V4 row has its own)
    rope_channels: int = 0  # the V4 row's bf16 tail

    def __post_init__(self) -> None:
        if self.fmt != V4_ROW:
            resolve_block_size(self.fmt, self.block_size)

    def fake_quantize(self, values: torch.Tensor) -> torch.Tensor:
        if self.fmt == V4_ROW:
            return fake_quantize_v4(values, self.rope_channels)
        return fake_quantize(values, self.fmt, self.block_size)

    def parts(self, channels: int) -> tuple[int, int]:
        """(data bytes, scale bytes) of one packed row."""
        if self.fmt == V4_ROW:
            return v4_parts(channels, self.rope_channels)
        total = row_bytes(self.fmt, channels, self.block_size)
        data = FORMATS[self.fmt].value_bytes(channels)
        return data, total - data

    def row_bytes(self, channels: int) -> int:
        return sum(self.parts(channels))

    def pack_rows(self, values: torch.Tensor) -> torch.Tensor:
        if self.fmt == V4_ROW:
            return pack_v4_rows(values, self.rope_channels)
        return pack_rows(values, self.fmt, self.block_size)

    def unpack_rows(self, data: torch.Tensor, channels: int) -> torch.Tensor:
        if self.fmt == V4_ROW:
            return unpack_v4_rows(data, channels, self.rope_channels)
        return unpack_rows(data, self.fmt, channels, self.block_size)


@dataclass(frozen=True)
class CacheQuant:
    """Cache quantization mode plus the block sizes from the model config."""

    mode: CacheQuantMode = "release"
    swa_kv_block_size: int = FORMATS["fp8"].release_block_size
    main_kv_block_size: int = FORMATS["nvfp4"].release_block_size
    index_block_size: int = FORMATS["mxfp4"].release_block_size
    rope_channels: int = 64  # qk_rope_head_dim: the V4 row's bf16 tail

    def __post_init__(self) -> None:
        if self.mode not in CACHE_QUANT_MODES:
            raise ValueError(f"cache quant mode must be one of {CACHE_QUANT_MODES}, got {self.mode!r}")
        _ = (self.swa_kv, self.main_kv, self.index)  # constructing each validates its block size

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def swa_kv(self) -> CacheFormat:
        if self.mode == "v4":
            return CacheFormat(V4_ROW, rope_channels=self.rope_channels)
        return CacheFormat("fp8", self.swa_kv_block_size)

    @property
    def main_kv(self) -> CacheFormat:
        if self.mode == "v4":
            return CacheFormat(V4_ROW, rope_channels=self.rope_channels)
        return CacheFormat("nvfp4", self.main_kv_block_size)

    @property
    def index(self) -> CacheFormat:
        return CacheFormat("mxfp4", self.index_block_size)


def quantize_swa_kv(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """SWA KV rows [..., head_dim] after RoPE."""
    return quant.swa_kv.fake_quantize(values) if quant.enabled else values


def quantize_main_kv(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """Compressed main KV rows [..., head_dim] after RoPE."""
    return quant.main_kv.fake_quantize(values) if quant.enabled else values


def quantize_index(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """Indexer keys [..., index_dim] or queries [..., heads, index_dim] after RoPE."""
    return quant.index.fake_quantize(values) if quant.enabled else values
