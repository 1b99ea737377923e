"""Independent scalar reference for the cache formats, built from the bit-level definitions.

Grids are enumerated from the e4m3fn / e2m1 bit layouts; rounding picks the nearest grid
value with ties to the even code. float32 arithmetic is done with numpy float32 scalars.
Slow (pure Python per element): use on small inputs only.
"""

from __future__ import annotations

import math

import numpy as np
import torch

f32 = np.float32


def _e4m3fn_value(code: int) -> float:
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0:
        return mantissa / 8 * 2.0**-6
    return (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def _e2m1_value(code: int) -> float:
    exponent, mantissa = (code >> 1) & 0x3, code & 0x1
    if exponent == 0:
        return mantissa * 0.5
    return (1 + mantissa / 2) * 2.0 ** (exponent - 1)


# (magnitude code, value) for the non-negative finite values; 0x7F is e4m3fn's NaN
E4M3_GRID = [(c, _e4m3fn_value(c)) for c in range(0x7F)]
E2M1_GRID = [(c, _e2m1_value(c)) for c in range(8)]


def round_to_grid(x: float, grid: list[tuple[int, float]]) -> float:
    """Nearest grid value to |x| with ties to the even code, saturating; sign of x kept."""
    magnitude = abs(x)
    if magnitude >= grid[-1][1]:
        return math.copysign(grid[-1][1], x)
    best_code, best_value = grid[0]
    for code, value in grid[1:]:
        if abs(value - magnitude) < abs(best_value - magnitude) or (
            abs(value - magnitude) == abs(best_value - magnitude) and code % 2 == 0
        ):
            best_code, best_value = code, value
    return math.copysign(best_value, x)


def _pow2_ceil(t: float) -> float:
    mantissa, exponent = math.frexp(t)  # t = mantissa * 2**exponent, mantissa in [0.5, 1)
    return 2.0 ** (exponent - 1) if mantissa == 0.5 else 2.0**exponent


def _group_scale(amax: float, fmt: str) -> float:
    if fmt == "fp8":
        return _pow2_ceil(float(f32(max(f32(amax), f32(1e-4))) * f32(1 / 448)))
    if fmt == "mxfp4":
        return _pow2_ceil(float(f32(max(f32(amax), f32(6 * 2.0**-126))) * f32(1 / 6)))
    target = float(f32(max(f32(amax), f32(6 * 2.0**-9))) / f32(6))
    return round_to_grid(target, E4M3_GRID)


def reference_row(row: list[float], fmt: str, block_size: int) -> list[float]:
    out = []
    for start in range(0, len(row), block_size):
        group = row[start : start + block_size]
        scale = _group_scale(max(abs(v) for v in group), fmt)
        for v in group:
            normalized = float(f32(v) / f32(scale))
            grid = E4M3_GRID if fmt == "fp8" else E2M1_GRID
            element = round_to_grid(normalized, grid)
            out.append(float(f32(element) * f32(scale)))
    return out


def reference_fake_quantize(values: torch.Tensor, fmt: str, block_size: int) -> torch.Tensor:
    """float32 tensor shaped like values, computed element by element."""
    rows = values.float().reshape(-1, values.shape[-1]).tolist()
    out = [reference_row(row, fmt, block_size) for row in rows]
    return torch.tensor(out, dtype=torch.float32).reshape(values.shape)
