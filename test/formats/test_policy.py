"""Refusal policy, argument validation, input immutability, and the CacheQuant entry points."""

from __future__ import annotations

import pytest
import torch

from sglang_asym.formats import (
    CacheQuant,
    fake_quantize,
    pack_rows,
    quantize_index,
    quantize_main_kv,
    quantize_swa_kv,
)

FORMATS = ["fp8", "nvfp4", "mxfp4"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_values_are_refused_naming_the_row(fmt: str, bad: float) -> None:
    values = torch.randn(2, 3, 40)
    values[1, 2, 37] = bad  # in the partial last group
    with pytest.raises(ValueError, match=rf"{fmt}: row \(1, 2\) contains NaN or inf"):
        fake_quantize(values, fmt, 16)
    rows = torch.randn(6, 40)
    rows[4, 0] = bad
    with pytest.raises(ValueError, match=rf"{fmt}: row 4 contains NaN or inf"):
        pack_rows(rows, fmt)
    with pytest.raises(ValueError, match=rf"{fmt}: row 0 contains NaN or inf"):
        fake_quantize(torch.tensor([1.0, bad]).bfloat16(), fmt, 32)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_values_whose_dequantized_form_overflows_float32_are_refused(fmt: str) -> None:
    rows = torch.ones(3, 32)
    rows[1, 3] = -3.4e38
    with pytest.raises(ValueError, match=rf"{fmt}: row 1 is too large for the format"):
        pack_rows(rows, fmt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_input_is_never_mutated_and_output_is_new_storage(fmt: str, dtype: torch.dtype) -> None:
    values = (torch.randn(5, 37) * 50).to(dtype)
    before = values.clone()
    out = fake_quantize(values, fmt, 16)
    assert torch.equal(values, before)
    assert out.data_ptr() != values.data_ptr() and out.is_contiguous()
    out.zero_()
    assert torch.equal(values, before)


def test_argument_validation() -> None:
    x = torch.randn(2, 32)
    with pytest.raises(ValueError, match=r"unknown cache format 'fp6'"):
        fake_quantize(x, "fp6", 32)
    for block in (0, -16, 2.5, True):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            fake_quantize(x, "nvfp4", block)
    with pytest.raises(ValueError, match="expected a floating-point tensor"):
        fake_quantize(torch.ones(2, 32, dtype=torch.int32), "fp8", 32)
    with pytest.raises(ValueError, match="non-empty channel dim"):
        fake_quantize(torch.ones(3, 0), "fp8", 32)
    with pytest.raises(ValueError, match="non-empty channel dim"):
        fake_quantize(torch.tensor(1.0), "fp8", 32)


def test_cache_quant_none_is_the_identity() -> None:
    x = torch.randn(3, 4, 48).bfloat16()
    quant = CacheQuant(mode="none")
    assert not quant.enabled
    for fn in (quantize_swa_kv, quantize_main_kv, quantize_index):
        assert fn(x, quant) is x


def test_cache_quant_release_uses_each_caches_format_and_config_block() -> None:
    x = torch.randn(2, 5, 96) * 3
    quant = CacheQuant(mode="release", swa_kv_block_size=48, main_kv_block_size=8, index_block_size=64)
    assert torch.equal(quantize_swa_kv(x, quant), fake_quantize(x, "fp8", 48))
    assert torch.equal(quantize_main_kv(x, quant), fake_quantize(x, "nvfp4", 8))
    assert torch.equal(quantize_index(x, quant), fake_quantize(x, "mxfp4", 64))
    # sanity: the three differ from each other and from x
    assert not torch.equal(quantize_swa_kv(x, quant), quantize_main_kv(x, quant))
    assert not torch.equal(quantize_index(x, quant), x)


def test_cache_quant_release_defaults_and_row_sizes() -> None:
    quant = CacheQuant()
    assert (quant.mode, quant.swa_kv_block_size, quant.main_kv_block_size, quant.index_block_size) == (
        "release", 32, 16, 32,
    )
    assert (quant.swa_kv.fmt, quant.main_kv.fmt, quant.index.fmt) == ("fp8", "nvfp4", "mxfp4")
    assert (quant.swa_kv.row_bytes(512), quant.main_kv.row_bytes(512), quant.index.row_bytes(128)) == (528, 288, 68)
    rows = torch.randn(4, 512)
    packed = quant.main_kv.pack_rows(rows)
    assert torch.equal(quant.main_kv.unpack_rows(packed, 512), quantize_main_kv(rows, quant))


def test_cache_quant_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        CacheQuant(mode="fp8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nvfp4: block_size must be a positive int"):
        CacheQuant(main_kv_block_size=0)
