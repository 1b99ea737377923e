"""The throughput-balanced prefill share: the public figures exactly, its invariants (hypothesis), bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.share import prefill_share, share_report

RP, RD = 12_000, 800  # representative tokens/s per GPU (ratio 15)


@pytest.mark.parametrize("r, expected", [
    (4, 4 / 19),  # chat: ~21%
    (20, 20 / 35),  # summarization: ~57%
    (1 / 6, (1 / 6) / (1 / 6 + 15)),  # reasoning: ~1%
])
def test_public_presets(r: float, expected: float) -> None:
    assert prefill_share(r, 1, RP, RD) == pytest.approx(expected, rel=1e-12)


def test_public_rounded_figures() -> None:
    assert round(100 * prefill_share(4, 1, RP, RD)) == 21
    assert round(100 * prefill_share(20, 1, RP, RD)) == 57
    assert round(100 * prefill_share(1, 6, RP, RD)) == 1
    # DeepSeek's disclosed day: 608B input, 168B output tokens -> r = 3.62 -> ~19%; they run 32 P : 144 D (18.2%)
    share = prefill_share(608e9, 168e9, RP, RD)
    assert round(608 / 168, 2) == 3.62
    assert round(100 * share) == 19
    assert abs(share - 32 / 176) < 0.015


def test_report_fields() -> None:
    out = share_report(2000, 500, RP, RD)
    assert out["ratio_r"] == 4.0 and out["rp_over_rd"] == 15.0
    assert out["prefill_share"] + out["decode_share"] == pytest.approx(1.0)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e7), st.floats(0, 1e7), st.floats(1e-3, 1e6), st.floats(1e-3, 1e6))
def test_share_in_unit_interval(i: float, o: float, rp: float, rd: float) -> None:
    if i == 0 and o == 0:
        return
    assert 0.0 <= prefill_share(i, o, rp, rd) <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-3, 1e4), st.floats(1e-3, 1e4), st.floats(1, 1e5), st.floats(1, 1e5))
def test_share_monotonic_in_r(r1: float, r2: float, rp: float, rd: float) -> None:
    lo, hi = sorted((r1, r2))
    assert prefill_share(lo, 1, rp, rd) <= prefill_share(hi, 1, rp, rd)


@pytest.mark.parametrize("args, message", [
    ((-1, 1, RP, RD), "input tokens must be >= 0"),
    ((1, -5, RP, RD), "output tokens must be >= 0"),
    ((1, 1, -RP, RD), "prefill tokens per GPU per second must be > 0"),
    ((1, 1, RP, 0), "decode tokens per GPU per second must be > 0"),
    ((0, 0, RP, RD), "both are 0"),
    ((math.nan, 1, RP, RD), "finite"),
    ((True, 1, RP, RD), "finite number"),
])
def test_bad_input(args, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        prefill_share(*args)
