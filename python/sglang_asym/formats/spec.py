"""Static description of the block-scaled cache formats and their row sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FormatName = Literal["fp8", "fp8_v4", "nvfp4", "mxfp4"]


@dataclass(frozen=True)
class FormatSpec:
    """One block-scaled format: element code width, scale encoding, release block size."""

    name: FormatName
    value_bits: int  # 8 (e4m3) or 4 (e2m1)
    scale_encoding: Literal["ue8m0", "e4m3"]
    release_block_size: int  # channels per scale in the released model

    def value_bytes(self, channels: int) -> int:
        return (channels * self.value_bits + 7) // 8


FORMATS: dict[str, FormatSpec] = {
    "fp8": FormatSpec("fp8", 8, "ue8m0", 32),
    # SGLang's V4 (H200) main-KV cache: fp8 nope channels, its own scale rule (codec.py), 64 per scale
    "fp8_v4": FormatSpec("fp8_v4", 8, "ue8m0", 64),
    "nvfp4": FormatSpec("nvfp4", 4, "e4m3", 16),
    "mxfp4": FormatSpec("mxfp4", 4, "ue8m0", 32),
}


def format_spec(fmt: str) -> FormatSpec:
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown cache format {fmt!r}; expected one of {sorted(FORMATS)}") from None


def resolve_block_size(fmt: str, block_size: int | None) -> int:
    """The block size to use: the given one (validated) or the release's for `fmt`."""
    spec = format_spec(fmt)
    if block_size is None:
        return spec.release_block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"{fmt}: block_size must be a positive int, got {block_size!r}")
    return block_size


def num_groups(channels: int, block_size: int) -> int:
    """Scale groups per row; a partial last group still has its own scale."""
    return -(-channels // block_size)


def row_bytes(fmt: str, channels: int, block_size: int | None = None) -> int:
    """Bytes of one packed row: element codes, then one scale byte per group.

    With the release block sizes: fp8 at 512 channels -> 528, nvfp4 at 512 -> 288,
    mxfp4 at 128 -> 68.
    """
    if isinstance(channels, bool) or not isinstance(channels, int) or channels <= 0:
        raise ValueError(f"{fmt}: channels must be a positive int, got {channels!r}")
    block = resolve_block_size(fmt, block_size)
    return format_spec(fmt).value_bytes(channels) + num_groups(channels, block)
