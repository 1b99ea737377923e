"""SGLang's V4 main-KV row (the `v4` pool layout SGLang picks on an H200): fp8 nope, bf16 rope.

A row of C channels whose last R are rotary (R = qk_rope_head_dim) is stored as
  data    bytes [0, C-R)            fp8_v4 codes of the nope channels (codec.py: ue8m0 scale per 64)
          bytes [C-R, C-R+2R)       the rope channels as bfloat16, little-endian
  scales  ceil((C-R)/64) bytes      the nope groups' ue8m0 scales, then one zero pad byte
At the released shape (C 512, R 64) that is 576 data bytes + 7 scales + 1 pad = 584, what SGLang's
`KVLayout.V4` holds per token. The rope channels are not block-scaled: rounding to bfloat16 is their
whole quantization (an identity for a bfloat16 model).
"""

from __future__ import annotations

import torch

from .codec import encode_groups, first_nonfinite_row
from .rows import pack_rows, unpack_rows
from .spec import format_spec, num_groups

NOPE_FORMAT = "fp8_v4"
SCALE_PAD_BYTES = 1


def _split(channels: int, rope_channels: int) -> int:
    if not 0 <= rope_channels < channels:
        raise ValueError(f"v4 rows: {rope_channels} rope channels of {channels} leave no nope channel")
    return channels - rope_channels


def v4_parts(channels: int, rope_channels: int) -> tuple[int, int]:
    """(data bytes, scale bytes) of one row."""
    nope = _split(channels, rope_channels)
    block = format_spec(NOPE_FORMAT).release_block_size
    return nope + 2 * rope_channels, num_groups(nope, block) + SCALE_PAD_BYTES


def fake_quantize_v4(values: torch.Tensor, rope_channels: int) -> torch.Tensor:
    """Quantize then dequantize rows [..., C]: same shape and dtype, new storage."""
    nope = _split(values.shape[-1], rope_channels)
    encoded = encode_groups(values[..., :nope], NOPE_FORMAT)
    rope = values[..., nope:].to(torch.bfloat16).float()
    if not bool(torch.isfinite(rope).all()):
        raise ValueError(f"{NOPE_FORMAT}: rope channels contain NaN or inf; cache values must be finite")
    out = torch.cat((encoded.decoded.flatten(-2)[..., :nope], rope), dim=-1)
    return out.to(values.dtype).contiguous()


def pack_v4_rows(values: torch.Tensor, rope_channels: int) -> torch.Tensor:
    """uint8 [rows, row bytes] from values [rows, C]."""
    if values.dim() != 2:
        raise ValueError(f"v4: pack_v4_rows expects [rows, channels], got shape {tuple(values.shape)}")
    nope = _split(values.shape[1], rope_channels)
    nope_rows = pack_rows(values[:, :nope], NOPE_FORMAT)  # codes, then scales
    rope = values[:, nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
    pad = torch.zeros(values.shape[0], SCALE_PAD_BYTES, dtype=torch.uint8)
    return torch.cat((nope_rows[:, :nope], rope, nope_rows[:, nope:], pad), dim=1)


def unpack_v4_rows(data: torch.Tensor, channels: int, rope_channels: int) -> torch.Tensor:
    """float32 [rows, C] from packed uint8 rows; raises ValueError naming a row that decodes to NaN/inf."""
    data_bytes, scale_bytes = v4_parts(channels, rope_channels)
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != data_bytes + scale_bytes:
        raise ValueError(f"v4: unpack_v4_rows expects uint8 [rows, {data_bytes + scale_bytes}] for {channels} "
                         f"channels, got {data.dtype} {tuple(data.shape)}")
    nope = channels - rope_channels
    nope_rows = torch.cat((data[:, :nope], data[:, data_bytes:data_bytes + scale_bytes - SCALE_PAD_BYTES]), dim=1)
    rope_bytes = torch.empty((data.shape[0], data_bytes - nope), dtype=torch.uint8).copy_(data[:, nope:data_bytes])
    rope = rope_bytes.view(torch.bfloat16).float()  # a fresh buffer: a row slice may not be 2-byte aligned
    bad = first_nonfinite_row(rope.unsqueeze(-2))
    if bad is not None:
        raise ValueError(f"v4: packed row {bad} has NaN or inf rope channels (corrupt or foreign bytes)")
    return torch.cat((unpack_rows(nope_rows, NOPE_FORMAT, nope), rope), dim=1)
