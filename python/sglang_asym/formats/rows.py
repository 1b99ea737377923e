"""Real packed cache rows: one uint8 row per cache row, as stored and shipped.

Byte layout of a row of C channels with G = ceil(C / block_size) scale groups:

  fp8    bytes [0, C)          e4m3fn bit pattern of channel c at byte c
         bytes [C, C + G)      ue8m0 scale of group g (biased exponent: scale = 2**(byte - 127))
  nvfp4  bytes [0, ceil(C/2))  e2m1 codes, two per byte: channel 2i in the low nibble,
                               channel 2i+1 in the high nibble (a missing last one is 0)
         then G bytes          e4m3fn bit pattern of each group's scale
  mxfp4  as nvfp4, but the G scale bytes are ue8m0 like fp8

An e2m1 code is sign << 3 | m, where m indexes (0, .5, 1, 1.5, 2, 3, 4, 6).
unpack_rows(pack_rows(x)) equals fake_quantize(x) bit for bit (as float32; the values are
exact in bfloat16, so casting to x's dtype gives fake_quantize's output).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .codec import decode_groups, encode_groups, first_nonfinite_row
from .spec import format_spec, num_groups, resolve_block_size, row_bytes


def pack_rows(values: torch.Tensor, fmt: str, block_size: int | None = None) -> torch.Tensor:
    """uint8 [rows, row_bytes] from values [rows, C] (refusal policy as in `codec`)."""
    if values.dim() != 2:
        raise ValueError(f"{fmt}: pack_rows expects [rows, channels], got shape {tuple(values.shape)}")
    spec = format_spec(fmt)
    encoded = encode_groups(values, fmt, block_size)
    codes = encoded.codes.flatten(-2)[:, : encoded.channels]
    if spec.value_bits == 4:
        pairs = F.pad(codes, (0, codes.shape[1] % 2)).unflatten(-1, (-1, 2))
        codes = pairs[..., 0] | (pairs[..., 1] << 4)
    return torch.cat((codes, encoded.scales), dim=1)


def unpack_rows(data: torch.Tensor, fmt: str, channels: int, block_size: int | None = None) -> torch.Tensor:
    """float32 [rows, channels] from packed uint8 [rows, row_bytes(fmt, channels, block_size)].

    Raises ValueError naming the first row whose bytes decode to NaN or inf.
    """
    spec = format_spec(fmt)
    block = resolve_block_size(fmt, block_size)
    width = row_bytes(fmt, channels, block)
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != width:
        raise ValueError(
            f"{fmt}: unpack_rows expects uint8 [rows, {width}] for {channels} channels, "
            f"got {data.dtype} {tuple(data.shape)}"
        )
    value_bytes = spec.value_bytes(channels)
    codes, scales = data[:, :value_bytes], data[:, value_bytes:]
    if spec.value_bits == 4:
        codes = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)
    groups = num_groups(channels, block)
    codes = F.pad(codes[:, :channels], (0, groups * block - channels)).unflatten(-1, (groups, block))
    decoded = decode_groups(codes, scales, spec)
    bad = first_nonfinite_row(decoded)
    if bad is not None:
        raise ValueError(f"{fmt}: packed row {bad} decodes to NaN or inf (corrupt or foreign bytes)")
    return decoded.flatten(-2)[:, :channels].contiguous()
