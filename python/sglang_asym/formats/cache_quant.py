"""Which cache gets which format: the model's entry points for cache quantization.

The released model quantizes (then dequantizes) three cache tensors right after RoPE,
over all channels including the rotary ones:
  SWA KV rows         fp8    (ue8m0 scale per `swa_kv_block_size` channels)
  compressed main KV  nvfp4  (e4m3 scale per `main_kv_block_size` channels)
  indexer keys and indexer queries   mxfp4  (ue8m0 scale per `index_block_size` channels)
Mode "none" turns all of them into the identity (the tensor itself is returned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .codec import fake_quantize
from .rows import pack_rows, unpack_rows
from .spec import FORMATS, FormatName, resolve_block_size, row_bytes

CacheQuantMode = Literal["none", "release"]


@dataclass(frozen=True)
class CacheFormat:
    """One format at one block size, with its fake-quantizer and row packers."""

    fmt: FormatName
    block_size: int

    def __post_init__(self) -> None:
        resolve_block_size(self.fmt, self.block_size)

    def fake_quantize(self, values: torch.Tensor, checked: bool = True) -> torch.Tensor:
        return fake_quantize(values, self.fmt, self.block_size, checked=checked)

    def row_bytes(self, channels: int) -> int:
        return row_bytes(self.fmt, channels, self.block_size)

    def pack_rows(self, values: torch.Tensor) -> torch.Tensor:
        return pack_rows(values, self.fmt, self.block_size)

    def unpack_rows(self, data: torch.Tensor, channels: int) -> torch.Tensor:
        return unpack_rows(data, self.fmt, channels, self.block_size)


@dataclass(frozen=True)
class CacheQuant:
    """Cache quantization mode plus the block sizes from the model config."""

    mode: CacheQuantMode = "release"
    swa_kv_block_size: int = FORMATS["fp8"].release_block_size
    main_kv_block_size: int = FORMATS["nvfp4"].release_block_size
    index_block_size: int = FORMATS["mxfp4"].release_block_size
    checked: bool = True  # False: non-finite rows pass through unrefused (capturable; see codec)

    def __post_init__(self) -> None:
        if self.mode not in ("none", "release"):
            raise ValueError(f"cache quant mode must be 'none' or 'release', got {self.mode!r}")
        _ = (self.swa_kv, self.main_kv, self.index)  # constructing each validates its block size

    @property
    def enabled(self) -> bool:
        return self.mode == "release"

    @property
    def swa_kv(self) -> CacheFormat:
        return CacheFormat("fp8", self.swa_kv_block_size)

    @property
    def main_kv(self) -> CacheFormat:
        return CacheFormat("nvfp4", self.main_kv_block_size)

    @property
    def index(self) -> CacheFormat:
        return CacheFormat("mxfp4", self.index_block_size)


def quantize_swa_kv(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """SWA KV rows [..., head_dim] after RoPE."""
    return quant.swa_kv.fake_quantize(values, quant.checked) if quant.enabled else values


def quantize_main_kv(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """Compressed main KV rows [..., head_dim] after RoPE."""
    return quant.main_kv.fake_quantize(values, quant.checked) if quant.enabled else values


def quantize_index(values: torch.Tensor, quant: CacheQuant) -> torch.Tensor:
    """Indexer keys [..., index_dim] or queries [..., heads, index_dim] after RoPE."""
    return quant.index.fake_quantize(values, quant.checked) if quant.enabled else values
