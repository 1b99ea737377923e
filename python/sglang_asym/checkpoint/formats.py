"""FP8 / FP4 codecs of the released checkpoint: quantize, pack, dequantize with e8m0 scales.

Formats: FP8 E4M3 over 32x32 blocks; FP8 E4M3 per row and 32 columns (Engram tables); FP4 E2M1
packed two per int8, per row and 32 columns. All scales are float8_e8m0fnu powers of two.

Quantization picks the smallest power-of-two scale that keeps a block's largest magnitude inside
the element format (448 for E4M3, 6 for E2M1); dequantize(quantize(w)) is the value the released
checkpoint holds for w, and that snapping is idempotent (re-quantizing a snapped tensor may pick a
finer scale when rounding lowered a block's maximum, but decodes to the same values).
"""

from __future__ import annotations

import math

import torch

BLOCK = 32  # scale block width (and height for dense FP8)
FP8_MAX = 448.0
FP4_MAX = 6.0
E8M0_BIAS = 127

# E2M1 code -> value; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between consecutive E2M1 magnitudes.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def fp8_block_scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return (math.ceil(rows / BLOCK), math.ceil(cols / BLOCK))


def row_scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """Scale shape of FP4 experts and FP8 Engram tables: one scale per row and 32 columns."""
    return (rows, math.ceil(cols / BLOCK))


def packed_fp4_shape(rows: int, cols: int) -> tuple[int, int]:
    if cols % 2:
        raise ValueError(f"FP4 packing needs an even column count, got {cols}")
    return (rows, cols // 2)


# ---- e8m0 scales -------------------------------------------------------------------------------
def _power_of_two_exponent(amax: torch.Tensor, element_max: float) -> torch.Tensor:
    """Smallest k with amax / 2**k <= element_max (k = 0 for all-zero blocks), clamped to e8m0."""
    ratio = (amax.double() / element_max)
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2**exponent, mantissa in [0.5, 1)
    k = exponent - (mantissa == 0.5).to(exponent.dtype)  # exact powers of two need no round-up
    k = torch.where(amax > 0, k, torch.zeros_like(k))
    return k.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int32)


def e8m0_from_exponent(k: torch.Tensor) -> torch.Tensor:
    return (k + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    if scale.dtype != torch.float8_e8m0fnu:
        raise ValueError(f"scales must be float8_e8m0fnu, got {scale.dtype}")
    raw = scale.view(torch.uint8)
    if bool((raw == 0xFF).any()):
        raise ValueError("scale holds the e8m0 NaN encoding 0xFF")
    exponent = raw.to(torch.int32) - E8M0_BIAS
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)


def _expand_scale(scale: torch.Tensor, rows: int, cols: int, row_block: int) -> torch.Tensor:
    full = e8m0_to_float(scale).repeat_interleave(BLOCK, dim=1)[:, :cols]
    if row_block > 1:
        full = full.repeat_interleave(row_block, dim=0)[:rows]
    return full


def _apply_scale(out: torch.Tensor, scale: torch.Tensor, row_block: int) -> None:
    """out *= scale, in place; whole blocks broadcast the scales instead of expanding them to a
    temporary as large as the weight."""
    rows, cols = out.shape
    factors = e8m0_to_float(scale)
    if rows % row_block == 0 and cols % BLOCK == 0:
        out.view(rows // row_block, row_block, cols // BLOCK, BLOCK).mul_(factors[:, None, :, None])
    else:
        out.mul_(_expand_scale(scale, rows, cols, row_block))


def _block_amax(w: torch.Tensor, row_block: int) -> torch.Tensor:
    rows, cols = w.shape
    pr, pc = math.ceil(rows / row_block) * row_block, math.ceil(cols / BLOCK) * BLOCK
    padded = torch.nn.functional.pad(w.abs().float(), (0, pc - cols, 0, pr - rows))
    per_row = padded.view(pr, pc // BLOCK, BLOCK).amax(dim=2)  # two 1-axis reductions: fast paths
    return per_row.view(pr // row_block, row_block, pc // BLOCK).amax(dim=1)


def _check_matrix(w: torch.Tensor) -> None:
    if w.ndim != 2 or not w.is_floating_point():
        raise ValueError(f"quantization needs a 2-D float matrix, got {tuple(w.shape)} {w.dtype}")


# ---- FP8 E4M3 ----------------------------------------------------------------------------------
def quantize_fp8(w: torch.Tensor, row_block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 values and e8m0 scales over row_block x 32 blocks (32: dense, 1: Engram rows)."""
    _check_matrix(w)
    rows, cols = w.shape
    k = _power_of_two_exponent(_block_amax(w, row_block), FP8_MAX)
    scale = e8m0_from_exponent(k)
    q = (w.float() / _expand_scale(scale, rows, cols, row_block)).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
                   row_block: int = BLOCK) -> torch.Tensor:
    if q.dtype != torch.float8_e4m3fn or q.ndim != 2:
        raise ValueError(f"FP8 weights must be 2-D float8_e4m3fn, got {tuple(q.shape)} {q.dtype}")
    rows, cols = q.shape
    expected = fp8_block_scale_shape(rows, cols) if row_block == BLOCK else row_scale_shape(rows, cols)
    if tuple(scale.shape) != expected:
        raise ValueError(f"FP8 scale shape {tuple(scale.shape)} does not match {expected} for weight {(rows, cols)}")
    out = q.float()
    _apply_scale(out, scale, row_block)
    return out.to(dtype)


# ---- FP4 E2M1, packed -------------------------------------------------------------------------
def quantize_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed int8 [rows, cols/2] (even column in the low nibble) and e8m0 scales [rows, cols/32]."""
    _check_matrix(w)
    rows, cols = w.shape
    packed_fp4_shape(rows, cols)
    k = _power_of_two_exponent(_block_amax(w, 1), FP4_MAX)
    scale = e8m0_from_exponent(k)
    v = w.float() / _expand_scale(scale, rows, cols, 1)
    # magnitude code = number of midpoints strictly below |v| (ties round towards zero)
    magnitude = torch.zeros(v.shape, dtype=torch.uint8)
    abs_v = v.abs()
    for midpoint in _E2M1_MIDPOINTS:
        magnitude += abs_v > midpoint
    codes = magnitude | (((v < 0) & (magnitude > 0)).to(torch.uint8) << 3)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), scale


def _pair_table() -> torch.Tensor:
    """byte -> (value of low nibble, value of high nibble)."""
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    byte = torch.arange(256)
    return torch.stack((values[byte & 15], values[byte >> 4]), dim=1)


_PAIRS = _pair_table()


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if packed.dtype != torch.int8 or packed.ndim != 2:
        raise ValueError(f"packed FP4 weights must be 2-D int8, got {tuple(packed.shape)} {packed.dtype}")
    rows, cols = packed.shape[0], packed.shape[1] * 2
    if tuple(scale.shape) != row_scale_shape(rows, cols):
        raise ValueError(
            f"FP4 scale shape {tuple(scale.shape)} does not match {row_scale_shape(rows, cols)} "
            f"for weight {(rows, cols)}"
        )
    out = _PAIRS[packed.view(torch.uint8).to(torch.int32)].view(rows, cols)
    _apply_scale(out, scale, 1)
    return out.to(dtype)
