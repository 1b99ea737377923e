"""SGLang's V4 main-KV row (formats/v4_rows.py): size, exact byte layout, scale rule, round trip, refusals.

That SGLang's own V4 page reader decodes these rows to the same values is checked against a real pool in
test/sglang_plugin/test_pool_payload.py."""

from __future__ import annotations

import pytest
import torch

from sglang_asym.formats import CacheFormat, CacheQuant, fake_quantize
from sglang_asym.formats.v4_rows import fake_quantize_v4, pack_v4_rows, unpack_v4_rows, v4_parts


def test_the_released_shape_is_sglangs_584_byte_row() -> None:
    assert v4_parts(512, 64) == (576, 8)
    assert CacheFormat("v4", rope_channels=64).row_bytes(512) == 584
    assert v4_parts(64, 16) == (48 + 32, 1 + 1)  # the small config: one partial nope group


def test_byte_layout_nope_codes_then_bf16_rope_then_scales_and_a_zero_pad() -> None:
    # nope 128 channels = 2 groups of 64 (group 0 amax 448: scale 1, ue8m0 127; group 1 amax 0.5:
    # scale 2**-9 ... 0.5/448 > 2**-10, so 2**-9, ue8m0 118); rope 2 channels in bf16
    row = torch.zeros(1, 130)
    row[0, 0], row[0, 1], row[0, 64], row[0, 128], row[0, 129] = 448.0, -2.0, 0.5, 1.0, -0.375
    packed = pack_v4_rows(row, 2)[0].tolist()
    assert len(packed) == 128 + 4 + 2 + 1
    assert packed[0:2] == [0x7E, 0xC0] and packed[64] == 0x78  # e4m3: 448, -2, 256 (0.5 / 2**-9)
    assert packed[128:132] == [0x80, 0x3F, 0xC0, 0xBE]  # bf16 1.0 and -0.375, little-endian
    assert packed[132:] == [127, 118, 0]


def test_the_scale_rule_is_sglangs_v4_store_not_the_release_fp8() -> None:
    # V4: one ue8m0 scale per 64 nope channels, 2**ceil(log2(max(amax, 1e-8) / 448)). Channels 32-63
    # share channel 0's scale (1), so 0.001 is an e4m3 subnormal there and rounds to 2**-9; the
    # release's fp8 gives them a scale of their own (2**-18) and keeps 2**-10.
    row = torch.zeros(1, 65)
    row[0, :32], row[0, 32:64] = 448.0, 0.001
    assert pack_v4_rows(row, 1)[0, 64 + 2].item() == 127
    assert fake_quantize_v4(row, 1)[0, 32].item() == 2.0**-9
    assert fake_quantize(row[:, :64], "fp8")[0, 32].item() == 2.0**-10
    # the amax floor is 1e-8 (the release's is 1e-4): 1e-9 takes the scale of 1e-8 / 448, 2**-35
    row[0, :64] = 1e-9
    assert pack_v4_rows(row, 1)[0, 64 + 2].item() == 127 - 35


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpack_of_pack_is_the_fake_quantization_bit_for_bit(dtype) -> None:
    x = (torch.randn(300, 512, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    x[7, :448] = 0.0  # an all-zero nope row
    codec = CacheFormat("v4", rope_channels=64)
    back = codec.unpack_rows(codec.pack_rows(x.float()), 512)
    assert torch.equal(back.to(dtype), codec.fake_quantize(x))
    assert torch.equal(back[:, 448:], x[:, 448:].to(torch.bfloat16).float())  # rope: bf16 rounding only
    # idempotent: the packed bytes of a fake-quantized row decode to the same values again
    again = codec.unpack_rows(codec.pack_rows(back), 512)
    assert torch.equal(again, back)


def test_cache_quant_v4_uses_the_v4_row_for_both_kv_caches_and_mxfp4_for_index_keys() -> None:
    quant = CacheQuant(mode="v4", rope_channels=64)
    assert quant.swa_kv == quant.main_kv == CacheFormat("v4", rope_channels=64)
    assert quant.index.fmt == "mxfp4" and quant.enabled
    with pytest.raises(ValueError, match="cache quant mode must be one of"):
        CacheQuant(mode="v5")


def test_non_finite_and_foreign_rows_are_refused() -> None:
    x = torch.zeros(2, 130)
    x[1, 129] = float("inf")
    with pytest.raises(ValueError, match="rope channels contain NaN or inf"):
        fake_quantize_v4(x, 2)
    x[1, 129], x[1, 3] = 0.0, float("nan")
    with pytest.raises(ValueError, match="row 1 contains NaN or inf"):
        pack_v4_rows(x, 2)
    with pytest.raises(ValueError, match=r"expects uint8 \[rows, 135\]"):
        unpack_v4_rows(torch.zeros(1, 134, dtype=torch.uint8), 130, 2)
    bad = torch.zeros(1, 135, dtype=torch.uint8)
    bad[0, 128:130] = torch.tensor([0x80, 0x7F])  # bf16 +inf in the rope bytes
    with pytest.raises(ValueError, match="row 0 has NaN or inf rope channels"):
        unpack_v4_rows(bad, 130, 2)
    with pytest.raises(ValueError, match="leave no nope channel"):
        v4_parts(64, 64)
