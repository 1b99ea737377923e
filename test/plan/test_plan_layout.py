"""Serving-unit layout and the dry run: the operator's refusal line exactly, NVL72 units, invariants (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.layout import LayoutError, Placement, ServingUnit, dry_run


def test_refusal_line_matches_the_operator_dry_run() -> None:
    unit = ServingUnit(4, 2, 64, 1)  # DeepInfer's layout: 2 x 4 prefill GPUs + 64 decode GPUs
    with pytest.raises(LayoutError) as info:
        dry_run(unit, 8, "same-domain", stage="prod-us", fleet="h200-use1")
    assert str(info.value) == "stage prod-us: fleet h200-use1 domain is 8 GPUs; serving unit needs 72 (same-domain)"


def test_deepinfer_unit_fills_one_nvl72() -> None:
    out = dry_run(ServingUnit(4, 2, 64, 1), 72).as_dict()
    assert out["serving_unit"]["gpus"] == 72
    assert out["units_per_domain"] == 1 and out["idle_gpus_per_domain"] == 0
    assert out["serving_unit"]["prefill_share"] == pytest.approx(8 / 72)
    assert out["kv_link"] == "nvlink"


def test_any_placement_spans_domains_but_not_replicas() -> None:
    out = dry_run(ServingUnit(4, 2, 8, 4), 8, Placement.ANY).as_dict()
    assert out["domains_per_unit"] == 5 and out["kv_link"] == "scale-out (rdma)" and out["units_per_domain"] == 0
    with pytest.raises(LayoutError, match="a decode replica needs 64"):
        dry_run(ServingUnit(4, 2, 64, 1), 8, "any")


def test_units_per_domain() -> None:
    out = dry_run(ServingUnit(1, 2, 2, 1), 8).as_dict()
    assert out["units_per_domain"] == 2 and out["idle_gpus_per_domain"] == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(prefill_gpus=-1, prefill_replicas=1, decode_gpus=1, decode_replicas=1), "prefill GPUs per replica"),
    (dict(prefill_gpus=1, prefill_replicas=1, decode_gpus=0, decode_replicas=1), "decode GPUs per replica"),
    (dict(prefill_gpus=0, prefill_replicas=2, decode_gpus=1, decode_replicas=1), "prefill replicas need >= 1 GPU"),
    (dict(prefill_gpus=1, prefill_replicas=1, decode_gpus=1, decode_replicas=1.5), "decode replicas"),
])
def test_bad_units(kwargs, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        ServingUnit(**kwargs)


def test_bad_domain_and_placement() -> None:
    with pytest.raises(PlanInputError, match="domain GPUs"):
        dry_run(ServingUnit(1, 1, 1, 1), 0)
    with pytest.raises(PlanInputError, match="placement must be one of"):
        dry_run(ServingUnit(1, 1, 1, 1), 8, "rack")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 16), st.integers(0, 8), st.integers(1, 72), st.integers(1, 8), st.integers(1, 144))
def test_same_domain_never_places_a_unit_larger_than_its_domain(a: int, b: int, c: int, d: int, domain: int) -> None:
    unit = ServingUnit(a, b, c, d)
    try:
        out = dry_run(unit, domain, "same-domain").as_dict()
    except LayoutError:
        assert unit.total_gpus > domain or max(a, c) > domain
        return
    assert out["serving_unit"]["gpus"] == unit.total_gpus <= domain
    assert out["units_per_domain"] * unit.total_gpus + out["idle_gpus_per_domain"] == domain
