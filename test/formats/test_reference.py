"""fake_quantize against the independent scalar reference, and hand-computed values."""

from __future__ import annotations

import pytest
import torch

from sglang_asym.formats import fake_quantize

from .cases import input_cases
from .reference import E2M1_GRID, E4M3_GRID, reference_fake_quantize

FORMAT_BLOCKS = [("fp8", 32), ("fp8", 8), ("nvfp4", 16), ("nvfp4", 32), ("mxfp4", 32), ("mxfp4", 16)]


def test_reference_grids_match_the_format_definitions() -> None:
    assert [v for _, v in E2M1_GRID] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    values = [v for _, v in E4M3_GRID]
    assert len(values) == 127 and values[1] == 2.0**-9 and values[8] == 2.0**-6 and values[-1] == 448.0
    codes = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    assert codes == values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("fmt,block", FORMAT_BLOCKS)
def test_matches_independent_reference(fmt: str, block: int, dtype: torch.dtype) -> None:
    for name, values in input_cases(width=32).items():
        values = values.to(dtype)
        expected = reference_fake_quantize(values, fmt, block)
        # dequantized values have at most 5 significant bits: exact in bfloat16
        assert torch.equal(expected.to(dtype).float(), expected), name
        ours = fake_quantize(values, fmt, block)
        assert ours.dtype == dtype
        mismatch = ours.float().view(torch.int32) != expected.view(torch.int32)
        assert not mismatch.any(), (
            f"{name}: first mismatch at {torch.nonzero(mismatch)[0].tolist()}: input "
            f"{values[mismatch][0].item()!r}, ours {ours[mismatch][0].item()!r}, reference {expected[mismatch][0].item()!r}"
        )


def _fq(values: list[float], fmt: str, block: int) -> list[float]:
    return fake_quantize(torch.tensor([values]), fmt, block)[0].tolist()


def test_mxfp4_levels_and_ties_to_even() -> None:
    # amax 6 -> scale 1; ties go to the even code: .25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -0.1, 4.9, 5.1]
    assert _fq(row, "mxfp4", 32) == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, -0.0, 4.0, 6.0]
    assert str(_fq(row, "mxfp4", 32)[9]) == "-0.0"


def test_mxfp4_scale_is_a_power_of_two_ceiling() -> None:
    # amax 7: 7/6 -> scale 2, so 7 -> 3.5 -> tie -> 4 -> 8; 1 -> 0.5; 0.4 -> 0.2 -> 0
    assert _fq([7.0, 1.0, 0.4], "mxfp4", 32) == [8.0, 1.0, 0.0]


def test_nvfp4_scale_rounds_in_e4m3_then_elements_saturate() -> None:
    # amax 7: 7/6 = 1.1667 -> e4m3 1.125; 7/1.125 = 6.2 saturates at 6 -> 6.75
    assert _fq([7.0, 1.125, -2.0], "nvfp4", 16) == [6.75, 1.125, -2.25]
    # amax 1e4: scale saturates at 448, so the largest value is 6 * 448
    assert _fq([1e4, -3000.0, 100.0], "nvfp4", 16) == [2688.0, -2688.0, 0.0]
    # all tiny: the scale floor is e4m3's smallest subnormal 2**-9
    assert _fq([2.0**-9, 2.0**-12], "nvfp4", 16) == [2.0**-9, 0.0]


def test_fp8_ties_subnormals_and_saturation() -> None:
    # amax 448 -> scale 1. 1.0625 ties between 1 and 1.125 -> 1 (even code);
    # 1.1875 ties between 1.125 and 1.25 -> 1.25; 2**-10 ties between 0 and 2**-9 -> 0;
    # 3 * 2**-10 ties between 2**-9 and 2**-8 -> 2**-8; 464 > 448 is clamped
    row = [448.0, 1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 2.0**-9 * 5, -0.0]
    assert _fq(row, "fp8", 32) == [448.0, 1.0, 1.25, 0.0, 2.0**-8, 2.0**-9 * 5, -0.0]
    # amax just over 448 doubles the scale: elements then step by 2 * grid
    assert _fq([449.0, 3.0, 1.0], "fp8", 32) == [448.0, 3.0, 1.0]
    assert _fq([1000.0, 3.0], "fp8", 32) == [1024.0, 3.0]


def test_fp8_scale_floor_and_all_zero_rows() -> None:
    # amax under 1e-4: scale 2**-22, so elements below 2**-31 round to zero
    assert _fq([2.0**-25, 2.0**-32, 2.0**-30], "fp8", 32) == [2.0**-25, 0.0, 2.0**-30]
    for fmt, block in [("fp8", 32), ("nvfp4", 16), ("mxfp4", 32)]:
        zeros = fake_quantize(torch.zeros(3, 40), fmt, block)
        assert torch.equal(zeros.view(torch.int32), torch.zeros(3, 40, dtype=torch.int32))


def test_partial_last_group_gets_its_own_scale() -> None:
    # 20 channels, block 16. Group 0: 100/6 -> e4m3 16, 100/16 = 6.25 saturates -> 96.
    # Group 1 (4 channels, zero-padded): 0.3/6 = 0.05 -> e4m3 0.05078125 (13 * 2**-8).
    row = [100.0] * 16 + [0.3, 0.1, -0.2, 0.05]
    scale = 13 * 2.0**-8
    assert _fq(row, "nvfp4", 16) == [96.0] * 16 + [6 * scale, 2 * scale, -4 * scale, 1 * scale]
