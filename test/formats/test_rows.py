"""Packed rows: sizes, exact byte layout, and unpack(pack(x)) == fake_quantize(x)."""

from __future__ import annotations

import pytest
import torch

from sglang_asym.formats import fake_quantize, pack_rows, row_bytes, unpack_rows

from .cases import input_cases

FORMAT_BLOCKS = [("fp8", 32), ("fp8", 16), ("nvfp4", 16), ("nvfp4", 32), ("mxfp4", 32), ("mxfp4", 8)]


def test_release_row_sizes() -> None:
    assert row_bytes("fp8", 512) == 528
    assert row_bytes("nvfp4", 512) == 288
    assert row_bytes("mxfp4", 128) == 68
    assert row_bytes("nvfp4", 512, 32) == 272
    assert row_bytes("nvfp4", 37, 16) == 19 + 3  # odd channel count, partial group
    assert row_bytes("fp8", 5) == 6


@pytest.mark.parametrize("channels", [0, -3, 2.0])
def test_row_bytes_rejects_bad_channel_counts(channels) -> None:
    with pytest.raises(ValueError, match="channels must be a positive int"):
        row_bytes("fp8", channels)


def _packed(values: list[float], fmt: str, block: int) -> list[int]:
    return pack_rows(torch.tensor([values]), fmt, block)[0].tolist()


def test_fp8_byte_layout() -> None:
    # group 0 (amax 448): scale 1 -> ue8m0 127; group 1 (amax .5): scale 2**-9 -> 118
    row = [448.0, 1.0, -2.0, 0.0] + [0.0] * 28 + [0.5, -0.25]
    packed = _packed(row, "fp8", 32)
    assert len(packed) == 36
    assert packed[:4] == [0x7E, 0x38, 0xC0, 0x00] and packed[4:32] == [0] * 28
    assert packed[32:34] == [0x78, 0xF0]  # 256 and -128 in units of 2**-9
    assert packed[34:] == [127, 118]


def test_nvfp4_byte_layout_low_nibble_first() -> None:
    # amax 6 -> e4m3 scale 1.0 (0x38); codes 6->7, 1->2, -0.5->9, 3->5, 2->4, pad->0
    assert _packed([6.0, 1.0, -0.5, 3.0, 2.0], "nvfp4", 16) == [0x27, 0x59, 0x04, 0x38]


def test_mxfp4_byte_layout() -> None:
    # amax 6 -> ue8m0 127; codes -6->15, 0->0, 1.5->3
    assert _packed([-6.0, 0.0, 1.5], "mxfp4", 32) == [0x0F, 0x03, 127]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("fmt,block", FORMAT_BLOCKS)
def test_unpack_of_pack_equals_fake_quantize(fmt: str, block: int, dtype: torch.dtype) -> None:
    for name, values in input_cases().items():
        rows = values.to(dtype).reshape(-1, values.shape[-1])
        packed = pack_rows(rows, fmt, block)
        assert packed.dtype == torch.uint8 and packed.shape == (rows.shape[0], row_bytes(fmt, rows.shape[1], block))
        unpacked = unpack_rows(packed, fmt, rows.shape[1], block)
        assert unpacked.dtype == torch.float32
        expected = fake_quantize(rows, fmt, block)
        assert torch.equal(unpacked.view(torch.int32), expected.float().view(torch.int32)), name
        assert torch.equal(unpacked.to(dtype), expected), name


def test_release_sized_rows_roundtrip() -> None:
    g = torch.Generator().manual_seed(7)
    for fmt, channels, width in [("fp8", 512, 528), ("nvfp4", 512, 288), ("mxfp4", 128, 68)]:
        rows = torch.randn(6, channels, generator=g).bfloat16()
        packed = pack_rows(rows, fmt)
        assert packed.shape == (6, width)
        assert torch.equal(unpack_rows(packed, fmt, channels).bfloat16(), fake_quantize(rows, fmt))


def test_zero_rows() -> None:
    packed = pack_rows(torch.empty(0, 64), "nvfp4")
    assert packed.shape == (0, 36)
    assert unpack_rows(packed, "nvfp4", 64).shape == (0, 64)


def test_pack_rejects_non_2d_input() -> None:
    with pytest.raises(ValueError, match=r"expects \[rows, channels\]"):
        pack_rows(torch.zeros(2, 3, 32), "fp8")


def test_unpack_rejects_wrong_shape_or_dtype() -> None:
    with pytest.raises(ValueError, match=r"uint8 \[rows, 528\]"):
        unpack_rows(torch.zeros(2, 527, dtype=torch.uint8), "fp8", 512)
    with pytest.raises(ValueError, match=r"uint8 \[rows, 68\]"):
        unpack_rows(torch.zeros(2, 68, dtype=torch.int16), "mxfp4", 128)


@pytest.mark.parametrize(
    "fmt,corrupt_byte,value",
    [("fp8", 5, 0x7F), ("fp8", 32, 0xFF), ("nvfp4", 16, 0x7F), ("mxfp4", 16, 0xFF)],
    ids=["fp8-nan-element", "fp8-ue8m0-255", "nvfp4-nan-scale", "mxfp4-ue8m0-255"],
)
def test_unpack_names_the_corrupt_row(fmt: str, corrupt_byte: int, value: int) -> None:
    packed = pack_rows(torch.randn(4, 32), fmt)
    packed[2, corrupt_byte] = value
    with pytest.raises(ValueError, match=rf"{fmt}: packed row 2 decodes to NaN or inf"):
        unpack_rows(packed, fmt, 32)
