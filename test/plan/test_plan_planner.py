"""The planner: pool sizes and memory fit for Flash on real GPUs, units within their domain (hypothesis), the
public NVL72 layout, and clear errors for bad input (negative rates, unknown GPUs, SLOs below the floor)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.planner import PlanOptions, idle_ttft_s, plan
from sglang_asym.plan.sim import Slo
from sglang_asym.plan.transfer_model import Link, Mode
from sglang_asym.plan.workload import LengthDist, Workload, preset

SLO = Slo(1.5, 0.06)  # the operators' ttft-p99 / itl-p99 alarms: 1500 ms, 60 ms
FAST = PlanOptions(sample_requests=300)


def test_asym_prefill_needs_half_the_gpus_of_symmetric_on_b300() -> None:
    asym = plan(preset("chat"), 200, SLO, gpu("B300"), "asym", FAST)
    sym = plan(preset("chat"), 200, SLO, gpu("B300"), "symmetric", FAST)
    assert asym["prefill"]["gpus_per_replica"] == 1 and sym["prefill"]["gpus_per_replica"] == 2
    assert asym["prefill_gpus"] < sym["prefill_gpus"]
    assert asym["memory"]["prefill_replica"]["weight_gb_per_gpu"] == pytest.approx(149.52)
    assert asym["transfer"]["bytes_mean_prompt"] < sym["transfer"]["bytes_mean_prompt"]
    assert [a["metric"] for a in asym["alarms"][:3]] == ["ttft-p99", "itl-p99", "error-rate"]
    assert asym["alarms"][0]["threshold_ms"] == 1500 and asym["alarms"][1]["threshold_ms"] == 60
    assert asym["alarms"][2]["threshold"] == 0.01


def test_h200_prefill_replica_is_two_gpus() -> None:
    out = plan(preset("chat"), 50, SLO, gpu("H200"), "asym", FAST)
    assert out["prefill"]["gpus_per_replica"] == 2
    assert out["serving_unit"]["serving_unit"]["gpus"] <= 8


def test_colocated_has_one_pool() -> None:
    out = plan(preset("chat"), 50, SLO, gpu("GB200"), "colocated", FAST)
    assert out["prefill"] is None and out["prefill_gpus"] == 0 and out["total_gpus"] == out["decode_gpus"]


def test_simulated_unit_reports_goodput() -> None:
    out = plan(preset("chat"), 100, SLO, gpu("B300"), "asym", FAST, simulate_unit=True, sim_requests=60)
    sim = out["simulation"]
    assert sim["requests"] == 60 and 0 <= sim["slo_attainment"] <= 1 and sim["goodput_rps_per_gpu"] > 0


def test_idle_ttft_short_prompt_needs_no_prefill() -> None:
    b300 = gpu("B300")
    link = Link("nvlink", b300.nvlink_bytes_per_s, 1e-3)
    opts = PlanOptions(window_chunk=None)
    # N <= W: asym runs only D's whole-window step; RFC #57738 also runs P over the prompt first
    assert idle_ttft_s(b300, Mode.ASYM, 100, 4, link, opts) < idle_ttft_s(b300, Mode.RFC57738, 100, 4, link, opts)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["B300", "GB200", "H200", "GB300"]), st.sampled_from(["asym", "symmetric", "rfc57738"]),
       st.floats(1, 400), st.sampled_from(["chat", "summarization", "deepseek"]))
def test_no_unit_larger_than_its_domain_under_same_domain(name: str, mode: str, rate: float, workload: str) -> None:
    g = gpu(name)
    out = plan(preset(workload), rate, Slo(5.0, 0.1), g, mode, FAST)
    unit = out["serving_unit"]
    assert unit["placement"] == "same-domain" and unit["serving_unit"]["gpus"] <= g.domain_gpus
    assert out["total_gpus"] == out["units"] * unit["serving_unit"]["gpus"]
    assert out["total_gpus"] == out["prefill_gpus"] + out["decode_gpus"]


@pytest.mark.parametrize("call, message", [
    (lambda: plan(preset("chat"), -1, SLO, gpu("B300"), "asym", FAST), "request rate must be a finite number > 0"),
    (lambda: plan(preset("chat"), 10, SLO, gpu("TPU"), "asym", FAST), "unknown GPU 'TPU'"),
    (lambda: plan(preset("chat"), 10, SLO, gpu("B300"), "pd", FAST), "unknown mode 'pd'"),
    (lambda: plan(preset("chat"), 10, Slo(1.5, 0.0005), gpu("B300"), "asym", FAST),
     r"ITL SLO 0.5 ms is below the physical floor: one decode step of a single request"),
    (lambda: plan(preset("summarization"), 10, Slo(0.005, 0.06), gpu("B300"), "asym", FAST),
     r"TTFT SLO 5 ms is below the physical floor: the p99 prompt"),
    (lambda: preset("code"), "unknown workload preset 'code'"),
    (lambda: LengthDist.lognormal(-5, 0.5), "mean length must be a finite number >= 1"),
    (lambda: LengthDist("pareto", 10), "length distribution must be one of"),
    (lambda: PlanOptions(decode_utilization=1.5), "utilisation"),
])
def test_bad_input(call, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        call()


def test_workload_presets_match_the_public_ratios() -> None:
    assert preset("chat").ratio == 4 and preset("summarization").ratio == 20
    assert preset("reasoning").ratio == pytest.approx(1 / 6) and preset("deepseek").ratio == pytest.approx(3.62)
    pairs = Workload("w", LengthDist.uniform(512, 1024), LengthDist.fixed(8)).sample(50, seed=3)
    assert all(512 <= p <= 1024 and o == 8 for p, o in pairs)
    assert pairs == Workload("w", LengthDist.uniform(512, 1024), LengthDist.fixed(8)).sample(50, seed=3)


def test_deepinfer_replica_sizes_fill_one_nvl72() -> None:
    """DeepInfer's V4.1-Flash layout: 4-GPU prefill replicas, a 64-GPU decode replica; two P + one D = 72 GPUs."""
    out = plan(preset("deepseek"), 100, SLO, gpu("GB200"), "asym", PlanOptions(decode_gpus=64, prefill_gpus=4,
                                                                                 sample_requests=300))
    unit = out["serving_unit"]
    assert unit["serving_unit"] == {"prefill": "2 x 4 GPUs", "decode": "1 x 64 GPUs", "gpus": 72,
                                    "prefill_share": 8 / 72}
    assert unit["units_per_domain"] == 1 and unit["idle_gpus_per_domain"] == 0
    with pytest.raises(PlanInputError, match=r"a P replica \(asym_p\) of 1 H200 GPUs does not hold"):
        plan(preset("chat"), 10, SLO, gpu("H200"), "asym", PlanOptions(prefill_gpus=1, sample_requests=100))
