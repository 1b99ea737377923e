"""Step-time models: the CPU fit recovers known coefficients; the GPU roofline's pieces by hand and its invariants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cpu_step_model import (CpuStepModel, decode_loop_samples, experts_touched, fit_prefill, fit_step,
                                        speed_check)
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpu_model import Efficiency, GpuStepModel
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.steptime import Role

TRUE = dict(a=0.07, c_expert=0.005, c_decode=0.016, c_window=0.08, r_window=0.002, b_ctx=0.004)


def _step(d: int, ctx: int, s: int, w: int) -> float:
    return TRUE["a"] + TRUE["c_expert"] * experts_touched(d + w, 128, 2) + TRUE["c_decode"] * d + TRUE["c_window"] * s + TRUE["r_window"] * w + TRUE["b_ctx"] * d * ctx / 1000


def test_step_fit_recovers_coefficients() -> None:
    shapes = [(1, 256, 0, 0), (16, 256, 0, 0), (8, 1024, 0, 0), (0, 0, 1, 8), (0, 0, 1, 128), (0, 0, 4, 512),
              (16, 256, 1, 8), (4, 1024, 1, 32)]
    samples = [{"decode_rows": d, "ctx": c, "window_segments": s, "window_rows": w, "seconds": _step(d, c, s, w)}
               for d, c, s, w in shapes]
    fit = fit_step(samples, 128, 2)
    for k, v in TRUE.items():
        assert fit[k] == pytest.approx(v, abs=1e-9)
    assert fit["max_rel_residual"] < 1e-9 and fit["samples"] == 8 and (fit["experts"], fit["top_k"]) == (128, 2)


def test_decode_loop_samples_from_a_step_log() -> None:
    """The first step of each run is dropped; contexts grow by the decode rows before the step; admit-all's windows
    are one segment per 128 rows, the budget policy's chunk one segment."""
    log = {"prompt_len": 256, "window_rows_per_request": 128, "policies": [
        {"policy": "budget", "window_chunk": 8, "steps": [
            {"decode_rows": 0, "window_rows": 8, "seconds": 9.0},  # first forward on fresh caches: left out
            {"decode_rows": 2, "window_rows": 8, "seconds": 0.2},
            {"decode_rows": 4, "window_rows": 0, "seconds": 0.3}]},
        {"policy": "admit_all", "window_chunk": None, "steps": [
            {"decode_rows": 0, "window_rows": 2048, "seconds": 5.8},
            {"decode_rows": 16, "window_rows": 1024, "seconds": 2.7}]}]}
    got = [(s["decode_rows"], s["ctx"], s["window_segments"], s["window_rows"], s["seconds"])
           for s in decode_loop_samples(log)]
    assert got == [(2, 256.0, 1, 8, 0.2), (4, 256 + 2 / 4, 0, 0, 0.3), (16, 256.0, 8, 1024, 2.7)]


def test_speed_check_finds_one_occasion_factor() -> None:
    fit = {**TRUE, "experts": 128, "top_k": 2}
    shapes = [(1, 256, 0, 0), (16, 256, 1, 8), (0, 0, 4, 512)]
    samples = [{"decode_rows": d, "ctx": c, "window_segments": s, "window_rows": w, "seconds": 1.25 * _step(d, c, s, w)}
               for d, c, s, w in shapes]
    out = speed_check(fit, samples)
    assert out["seconds_over_fit"] == pytest.approx(1.25) and out["max_rel_residual"] == pytest.approx(0, abs=1e-12)
    samples[0]["seconds"] *= 2  # one sample off: the factor moves, the residual shows it
    out = speed_check(fit, samples)
    assert out["samples"] == 3 and 1.25 < out["seconds_over_fit"] < 2.5 and out["max_rel_residual"] > 0.2


def test_committed_cpu_fit_is_the_decode_loops() -> None:
    """The committed fit is the one `plan_cpu_steptime.py --refit` makes from the committed decode-loop log."""
    results = Path(__file__).resolve().parents[2] / "benchmark" / "results"
    committed = json.loads((results / "plan_cpu_steptime.json").read_text())
    loop = decode_loop_samples(json.loads((results / "decode_itl.json").read_text()))
    refit = fit_step(loop, 128, 2)
    assert committed["step_fit"]["samples"] == len(loop) == 450
    for k in ("a", "c_expert", "c_decode", "c_window", "r_window", "b_ctx"):
        assert committed["step_fit"][k] == pytest.approx(refit[k], rel=1e-9, abs=1e-15)


def test_prefill_fit_and_model(tmp_path) -> None:
    p = (0.05, 0.0015, 2e-7)
    samples = [{"tokens": n, "seconds": p[0] + p[1] * n + p[2] * n * n} for n in (256, 512, 1024, 2048)]
    fit = fit_prefill(samples)
    assert (fit["p0"], fit["p1"], fit["p2"]) == pytest.approx(p, rel=1e-6)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"step_fit": {**TRUE, "experts": 128, "top_k": 2},
                                "prefill_fit": {"prefill": fit, "full": fit}}))
    model = CpuStepModel.from_json(path)
    assert model.decode_step_s([256] * 16, [8]) == pytest.approx(_step(16, 256, 1, 8))
    assert model.decode_step_s([], []) == 0.0
    # a chunk at a context costs the difference of the two totals plus one fixed cost
    assert model.prefill_s(1024, Role.ASYM_P, 1024) == pytest.approx(p[0] + p[1] * 1024 + p[2] * (2048 ** 2 - 1024 ** 2))
    assert model.prefill_step_s([(512, 0), (512, 0)], Role.FULL) == pytest.approx(p[0] + 2 * (p[1] * 512 + p[2] * 512 ** 2))
    with pytest.raises(PlanInputError, match="needs at least 3 samples"):
        fit_prefill(samples[:2])


B300 = gpu("B300")


def test_cpu_occupancy_by_hand() -> None:
    assert experts_touched(1, 128, 2) == pytest.approx(2)
    assert experts_touched(16, 128, 2) == pytest.approx(128 * (1 - (126 / 128) ** 16))


def test_expert_occupancy_by_hand() -> None:
    m = GpuStepModel(B300, 8)
    assert m.experts_touched(0) == 0
    assert m.experts_touched(1) == pytest.approx(6)  # one token selects k = 6 of 384
    assert m.experts_touched(64) == pytest.approx(384 * (1 - (1 - 6 / 384) ** 64))
    assert m.experts_touched(1e6) == pytest.approx(384)


def test_weight_bytes_limits() -> None:
    m = GpuStepModel(B300, 8)
    p = m.profile
    full = p.dense_bytes(Role.FULL) + p.expert_bytes(Role.FULL) / 8
    assert m.weight_read_bytes(Role.FULL, 1e6) == pytest.approx(full)
    assert p.weight_bytes(Role.ASYM_P) < 0.51 * p.weight_bytes(Role.FULL)


def test_comm_only_between_gpus() -> None:
    assert GpuStepModel(B300, 1).comm_seconds(Role.FULL, 64) == 0.0
    inside, across = GpuStepModel(B300, 8), GpuStepModel(B300, 8, within_domain=False)
    assert across.comm_seconds(Role.FULL, 64) == pytest.approx(inside.comm_seconds(Role.FULL, 64) * 9)  # 900 vs 100 GB/s


def test_prefill_of_half_the_layers_is_about_twice_as_fast() -> None:
    full = GpuStepModel(B300, 2, Role.FULL).prefill_tokens_per_gpu_s(Role.FULL)
    half = GpuStepModel(B300, 2, Role.ASYM_P).prefill_tokens_per_gpu_s(Role.ASYM_P)
    assert 1.8 < half / full < 2.3


def test_bad_efficiency_and_size() -> None:
    with pytest.raises(PlanInputError, match="mbu"):
        Efficiency(mbu=1.5)
    with pytest.raises(PlanInputError, match="int >= 1 GPUs"):
        GpuStepModel(B300, 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 255), st.integers(1, 200_000), st.sampled_from(["H200", "B300", "GB200", "GB300"]),
       st.sampled_from([1, 8, 64]))
def test_decode_step_grows_with_batch_and_context(batch: int, ctx: int, name: str, gpus: int) -> None:
    m = GpuStepModel(gpu(name), gpus)
    step = m.decode_step_s([ctx] * batch)
    assert 0 < step <= m.decode_step_s([ctx] * (batch + 1))
    assert step <= m.decode_step_s([ctx + 1000] * batch)
    assert step <= m.decode_step_s([ctx] * batch, [32])


def test_profile_bytes_are_footprints_parts() -> None:
    parts = json.loads((Path(__file__).resolve().parents[2] / "benchmark" / "results" / "footprint_flash.json")
                       .read_text())["parts"]
    p = GpuStepModel(B300, 1).profile
    assert p.weight_bytes(Role.ASYM_P) == parts["embeddings"]["bytes"] + parts["encoder_layers"]["bytes"]
    full = sum(parts[k]["bytes"] for k in ("embeddings", "encoder_layers", "kv_source_kv_path", "kv_source_rest",
                                           "decoder_layers", "final_norm_and_head"))
    assert p.weight_bytes(Role.FULL) == full
    # attention: 20 window layers for P; 18 ratio-2 and 20 ratio-1 compressed layers, 3 + 5 index layers for D
    assert (p.prefill_counts.window_layers, p.full_counts.compressed, p.full_counts.indexed) == (
        20, ((1, 20), (2, 18)), ((1, 5), (2, 3)))
    assert p.kv_read_bytes(1000, Role.FULL) == 40 * 128 * 528 + (20 * 512 + 18 * 500) * 288 + (5 * 1000 + 3 * 500) * 68
