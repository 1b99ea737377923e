"""Block-scaled quantization of cache rows: element codes, scale bytes, dequantized values.

Channels (the last dim) are cut into consecutive groups of `block_size`; a partial last
group is zero-padded, which never changes its scale. Per group, with amax = max |x| in fp32:

  fp8    scale = 2**ceil(log2(max(amax, 1e-4) * f32(1/448)))   stored as ue8m0 (biased exponent)
         element = e4m3fn(clamp(x / scale, -448, 448)), round-to-nearest-even, subnormals kept
  fp8_v4 scale = 2**ceil(log2(max(amax, 1e-8) / 448))   (SGLang's V4 cache store), elements as fp8
  mxfp4  scale = 2**ceil(log2(max(amax, 6 * 2**-126) * f32(1/6)))   stored as ue8m0
         element = e2m1(x / scale)
  nvfp4  scale = e4m3fn(min(max(amax, 6 * 2**-9) / 6, 448))   stored as e4m3fn bits
         element = e2m1(x / scale)

`f32(c)` is the constant rounded to float32, and every product/quotient is a float32
operation: that is the released reference's arithmetic and decides rare boundary cases.
e2m1 rounding is to the nearest of +-{0, .5, 1, 1.5, 2, 3, 4, 6} with ties to the even code
and saturation at 6; the sign of x is kept even when the magnitude rounds to zero (-0.0).
Dequantized value = element * scale, exact in float32 (and in bfloat16).

Policy for values a format cannot hold:
- Finite overflow saturates exactly as the reference does: fp8 elements clamp at +-448,
  e2m1 elements at +-6, and the nvfp4 e4m3 scale at 448 (so nvfp4 rows saturate at +-2688).
- A row containing NaN or +-inf is refused with ValueError naming the row: the reference
  turns such groups into NaN or silently into zeros, neither of which is a cache value.
- A finite group whose dequantized value would overflow float32 (amax within a few percent
  of float32's maximum, fp8 and mxfp4 only; the reference yields inf) is refused likewise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .spec import FormatSpec, format_spec, resolve_block_size

# float32 roundings of the reference's reciprocal constants (exact as Python floats)
_RECIP_448 = float(torch.tensor(1 / 448, dtype=torch.float32))
_RECIP_6 = float(torch.tensor(1 / 6, dtype=torch.float32))
_FP8_AMAX_FLOOR = 1e-4
_FP8_V4_AMAX_FLOOR = 1e-8
_MXFP4_AMAX_FLOOR = 6 * 2.0**-126
_NVFP4_AMAX_FLOOR = 6 * 2.0**-9  # smallest scale = smallest e4m3 subnormal, 2**-9
_E4M3_MAX = 448.0

# e2m1 magnitude code m (0..7) is the index into this list; code bit 3 is the sign.
E2M1_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring levels. A tie rounds toward the even code: down at
# midpoints whose lower neighbour has an even code, up at the others.
_TIE_DOWN_MIDPOINTS = (0.25, 1.25, 2.5, 5.0)
_TIE_UP_MIDPOINTS = (0.75, 1.75, 3.5)


@dataclass(frozen=True)
class EncodedGroups:
    """A tensor [..., channels] in one format, grouped as [..., groups, block_size].

    codes:   uint8 [..., G, block]: e4m3fn bit patterns (fp8) or e2m1 codes 0..15 (fp4).
    scales:  uint8 [..., G]: ue8m0 biased exponents (fp8, mxfp4) or e4m3fn bits (nvfp4).
    decoded: float32 [..., G, block]: codes * scales; padding channels decode to 0.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    decoded: torch.Tensor
    channels: int


def _row_name(index: tuple[int, ...]) -> str:
    """'5' for [rows, C] inputs, '(1, 2)' for [a, b, C]; a 1-D input is row '0'."""
    if not index:
        return "0"
    return str(index[0]) if len(index) == 1 else str(index)


def _first_row(bad_groups: torch.Tensor) -> str | None:
    """Name the first row (index over the leading dims) that has a True group, or None."""
    bad_rows = bad_groups.any(dim=-1)
    if not bool(bad_rows.any()):
        return None
    return _row_name(tuple(torch.nonzero(bad_rows)[0].tolist()))


def _ue8m0_ceil(target: torch.Tensor) -> torch.Tensor:
    """Biased exponent of the smallest power of two >= target (positive normal float32)."""
    bits = target.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    has_fraction = (bits & 0x7FFFFF) != 0
    return (exponent + has_fraction.to(torch.int32)).to(torch.uint8)


def _ue8m0_value(biased_exponent: torch.Tensor) -> torch.Tensor:
    return (biased_exponent.to(torch.int32) << 23).view(torch.float32)


def _e2m1_codes(normalized: torch.Tensor) -> torch.Tensor:
    magnitude = normalized.abs()
    tables = _constants(magnitude.device)
    tie_down, tie_up = tables["tie_down"], tables["tie_up"]
    # count of midpoints passed: strictly for tie-down midpoints, inclusively for tie-up ones
    code = torch.bucketize(magnitude, tie_down, right=False) + torch.bucketize(magnitude, tie_up, right=True)
    sign = torch.signbit(normalized).to(torch.uint8) << 3
    return code.to(torch.uint8) | sign


@functools.lru_cache(maxsize=None)
def _constants(device: torch.device) -> dict[str, torch.Tensor]:
    """The e2m1 tables on `device`, made once: a host-to-device copy cannot run inside a CUDA graph."""
    signed_levels = E2M1_LEVELS + tuple(-v for v in E2M1_LEVELS)
    return {
        "signed_levels": torch.tensor(signed_levels, dtype=torch.float32, device=device),
        "tie_down": torch.tensor(_TIE_DOWN_MIDPOINTS, dtype=torch.float32, device=device),
        "tie_up": torch.tensor(_TIE_UP_MIDPOINTS, dtype=torch.float32, device=device),
    }


def decode_groups(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """float32 [..., G, block] from uint8 codes [..., G, block] and scale bytes [..., G]."""
    if spec.value_bits == 8:
        elements = codes.view(torch.float8_e4m3fn).float()
    else:
        elements = _constants(codes.device)["signed_levels"][codes.long()]
    if spec.scale_encoding == "ue8m0":
        scale = _ue8m0_value(scales)
    else:
        scale = scales.view(torch.float8_e4m3fn).float()
    return elements * scale.unsqueeze(-1)


def first_nonfinite_row(decoded: torch.Tensor) -> str | None:
    """Name the first row of decoded groups [..., G, block] holding NaN or inf, or None."""
    # one reduction answers the common case: a sum of finite values is finite unless it overflows, and a NaN
    # or inf makes it NaN or inf (the row search below then runs, and names the row or finds none)
    if decoded.numel() and bool(torch.isfinite(decoded.sum())):
        return None
    return _first_row(~torch.isfinite(decoded).all(dim=-1))


@torch.no_grad()
def encode_groups(values: torch.Tensor, fmt: str, block_size: int | None = None) -> EncodedGroups:
    """Quantize values [..., channels] (any float dtype, not modified) per the module rules.

    block_size None means the release's block size for `fmt`.
    """
    spec = format_spec(fmt)
    block = resolve_block_size(fmt, block_size)
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise ValueError(f"{fmt}: expected a floating-point tensor, got {getattr(values, 'dtype', type(values))}")
    if values.dim() == 0 or values.shape[-1] == 0:
        raise ValueError(f"{fmt}: values need a non-empty channel dim, got shape {tuple(values.shape)}")
    channels = values.shape[-1]
    grouped = F.pad(values.float(), (0, -channels % block)).unflatten(-1, (-1, block))
    amax = grouped.abs().amax(dim=-1)
    bad = _first_row(~torch.isfinite(amax))
    if bad is not None:
        raise ValueError(f"{fmt}: row {bad} contains NaN or inf; cache values must be finite")

    if fmt == "nvfp4":
        scale_fp8 = (amax.clamp_min(_NVFP4_AMAX_FLOOR) / 6).clamp_max(_E4M3_MAX).to(torch.float8_e4m3fn)
        scales = scale_fp8.view(torch.uint8)
        scale = scale_fp8.float()
    else:
        if fmt == "fp8":
            target = amax.clamp_min(_FP8_AMAX_FLOOR) * _RECIP_448
        elif fmt == "fp8_v4":
            target = amax.clamp_min(_FP8_V4_AMAX_FLOOR) / _E4M3_MAX
        else:
            target = amax.clamp_min(_MXFP4_AMAX_FLOOR) * _RECIP_6
        scales = _ue8m0_ceil(target)
        scale = _ue8m0_value(scales)
    normalized = grouped / scale.unsqueeze(-1)
    if spec.value_bits == 8:
        codes = normalized.clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        codes = _e2m1_codes(normalized)

    decoded = decode_groups(codes, scales, spec)
    bad = first_nonfinite_row(decoded)
    if bad is not None:
        raise ValueError(f"{fmt}: row {bad} is too large for the format: its dequantized value overflows float32")
    return EncodedGroups(codes=codes, scales=scales, decoded=decoded, channels=channels)


def fake_quantize(values: torch.Tensor, fmt: str, block_size: int | None = None) -> torch.Tensor:
    """Quantize then dequantize values [..., channels]: same shape and dtype, new storage.

    Bit-identical to the released reference for every input it accepts (see module doc for
    the refusal policy). No gradient flows through (inference only).
    """
    encoded = encode_groups(values, fmt, block_size)
    out = encoded.decoded.flatten(-2)[..., : encoded.channels]
    return out.to(values.dtype).contiguous()
