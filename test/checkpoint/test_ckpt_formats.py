"""FP8 / FP4 codecs: bit layout, scale choice, exact round trips, shape checks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_asym.checkpoint import formats

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def reference_fp4_decode(packed: torch.Tensor, scale: torch.Tensor) -> list[list[float]]:
    """Element-by-element decoder written independently of formats.py."""
    rows, half = packed.shape
    exps = scale.view(torch.uint8).tolist()
    out = []
    for r in range(rows):
        row = []
        for c in range(half):
            byte = packed[r, c].item() & 0xFF
            for code, col in ((byte & 0x0F, 2 * c), (byte >> 4, 2 * c + 1)):
                row.append(E2M1[code] * 2.0 ** (exps[r][col // 32] - 127))
        out.append(row)
    return out


def test_fp4_nibble_order_and_code_table():
    # byte 0x71: low nibble 1 (0.5) -> column 0, high nibble 7 (6.0) -> column 1
    codes = list(range(16))
    packed_bytes = [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(8)] + [0x71] * 8
    packed = torch.tensor([packed_bytes], dtype=torch.uint8).view(torch.int8)
    scale = formats.e8m0_from_exponent(torch.tensor([[0]]))
    out = formats.dequantize_fp4(packed, scale)
    assert out[0, :16].tolist() == E2M1
    assert out[0, 16:].tolist() == [0.5, 6.0] * 8


def test_fp4_matches_independent_reference():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(5, 96, generator=g) * torch.tensor([1e-3, 1.0, 30.0]).repeat_interleave(32)
    packed, scale = formats.quantize_fp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (5, 48)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (5, 3)
    assert formats.dequantize_fp4(packed, scale).tolist() == reference_fp4_decode(packed, scale)


def test_fp4_rounds_to_nearest_code():
    w = torch.tensor([[6.0, 0.2, 0.3, -0.8, 1.3, -2.6, 4.9, 5.1] * 4])  # amax 6 -> scale 1
    packed, scale = formats.quantize_fp4(w)
    assert scale.view(torch.uint8).tolist() == [[127]]
    assert formats.dequantize_fp4(packed, scale)[0, :8].tolist() == [6.0, 0.0, 0.5, -1.0, 1.5, -3.0, 4.0, 6.0]


def test_fp8_block_scales_cover_32x32_blocks():
    w = torch.zeros(40, 70)
    w[0, 0] = 448.0  # block (0, 0): scale 2^0
    w[33, 35] = 832.0  # block (1, 1): 832/448 -> 2^1, stored as 416
    w[5, 65] = 0.001  # block (0, 2): 0.001/448 -> 2^-18
    q, scale = formats.quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (40, 70)
    assert scale.shape == (2, 3)
    exps = (scale.view(torch.uint8).to(torch.int32) - 127).tolist()
    assert exps == [[0, 0, -18], [0, 1, 0]]
    back = formats.dequantize_fp8(q, scale)
    assert back[0, 0].item() == 448.0 and back[33, 35].item() == 832.0
    assert math.isclose(back[5, 65].item(), 0.001, rel_tol=2 ** -3)


def test_fp8_rows_scales_are_per_row():
    w = torch.ones(3, 64)
    w[1] *= 1024.0  # 1024/448 -> 2^2
    q, scale = formats.quantize_fp8(w, row_block=1)
    assert scale.shape == (3, 2)
    assert (scale.view(torch.uint8).to(torch.int32) - 127).tolist() == [[-8, -8], [2, 2], [-8, -8]]
    assert torch.equal(formats.dequantize_fp8(q, scale, row_block=1), w)


def test_exact_powers_of_two_need_no_round_up():
    # amax exactly 448 * 2^k must use scale 2^k, not 2^(k+1)
    for k in (-5, 0, 3):
        w = torch.full((32, 32), 448.0 * 2.0**k)
        _, scale = formats.quantize_fp8(w)
        assert scale.view(torch.uint8).item() == 127 + k


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 70), cols=st.integers(1, 40).map(lambda c: 2 * c),
    log_scale=st.floats(-20, 20), seed=st.integers(0, 2**31 - 1),
)
def test_snapping_is_idempotent_and_scales_are_tight(rows, cols, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 2.0**log_scale
    for kind in ("fp8", "fp8_rows", "fp4"):
        if kind == "fp4":
            def snap(x):
                return formats.dequantize_fp4(*formats.quantize_fp4(x))
            q, s = formats.quantize_fp4(w)
            element_max, row_block = 6.0, 1
        else:
            row_block = 1 if kind == "fp8_rows" else 32

            def snap(x, rb=row_block):
                return formats.dequantize_fp8(*formats.quantize_fp8(x, row_block=rb), row_block=rb)
            q, s = formats.quantize_fp8(w, row_block=row_block)
            element_max = 448.0
        once = snap(w)
        # a checkpoint written from already-snapped weights holds exactly the same values
        assert torch.equal(snap(once), once)
        # every block's scale is the smallest power of two that fits its largest magnitude
        amax = formats._block_amax(w, row_block)
        factors = formats.e8m0_to_float(s)
        assert bool((amax <= factors * element_max).all())
        assert bool(((amax == 0) | (amax > factors * element_max / 2)).all())


def test_scale_shape_mismatch_is_rejected():
    q, s = formats.quantize_fp8(torch.randn(64, 64))
    with pytest.raises(ValueError, match=r"FP8 scale shape \(1, 2\) does not match \(2, 2\)"):
        formats.dequantize_fp8(q, s[:1])
    p, s4 = formats.quantize_fp4(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"FP4 scale shape"):
        formats.dequantize_fp4(p, s4[:, :1])
    with pytest.raises(ValueError, match="even column count"):
        formats.quantize_fp4(torch.randn(4, 33))
    with pytest.raises(ValueError, match="float8_e8m0fnu"):
        formats.dequantize_fp8(q, s.float())
