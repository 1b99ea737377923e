"""The committed validation table is what benchmark/plan_validate.py computes from the committed fits and benchmarks,
every figure of it within the target; the step-delay fit recovers known delays; the prefill speed factor."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmark" / "results"


@pytest.fixture(scope="module")
def plan_validate():
    spec = importlib.util.spec_from_file_location("plan_validate", ROOT / "benchmark" / "plan_validate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inputs(plan_validate):
    model = plan_validate.CpuStepModel.from_json(RESULTS / "plan_cpu_steptime.json")
    link = plan_validate.loopback_link(json.loads((RESULTS / "transfer.json").read_text()))
    return model, link, json.loads(plan_validate.CALIBRATION.read_text())


def test_committed_rows_are_reproduced_and_all_within_target(plan_validate, inputs) -> None:
    model, link, calibration = inputs
    committed = json.loads((RESULTS / "plan_validation.json").read_text())
    delays, fit = plan_validate.fit_step_delays(model, link, calibration)
    assert fit == committed["step_delays"]
    assert (delays.colocated_s, delays.cohosted_s) == (0.079, 0.042)
    speeds: dict = {}
    rows = plan_validate.validate_decode_itl(model) + plan_validate.validate_serving(model, link, delays, speeds)
    assert rows == committed["rows"]
    assert speeds == committed["serving_prefill_speed"]
    assert len(rows) == 32 and all(abs(r["relative_error"]) <= plan_validate.TARGET for r in rows)
    assert committed["within_target"] == 32
    # without the delays the five colocated / cohosted ITL figures they model miss the target
    assert sum(abs(r["relative_error_without_delays"]) > plan_validate.TARGET for r in rows
               if r["benchmark"] == "serving") == 5


def test_delay_fit_recovers_known_delays(plan_validate, inputs) -> None:
    """A calibration sweep whose ITL figures are the simulator's own at 50 / 30 ms gives back exactly those delays."""
    model, link, calibration = inputs
    truth = plan_validate.StepDelays(0.05, 0.03)
    synthetic = copy.deepcopy(calibration)
    sim = plan_validate.replay_sweep(synthetic["sweep"], model, link, synthetic["window_chunk"], truth)
    for mode, entry in synthetic["sweep"]["modes"].items():
        for rate in entry["rates"]:
            rate["itl"]["p50_ms"] = sim[(mode, rate["rate_rps"])]["itl_p50_ms"]
            rate["itl"]["p99_ms"] = sim[(mode, rate["rate_rps"])]["itl_p99_ms"]
    delays, fit = plan_validate.fit_step_delays(model, link, synthetic)
    assert delays == truth and fit["loss_colocated"] == fit["loss_pd"] == 0.0


def test_prefill_speed_is_reported_over_predicted(plan_validate) -> None:
    """A mode whose servers reported twice the fit's prefill seconds gets factor 2; the scaled model doubles p0..p2."""
    model = plan_validate.CpuStepModel.from_json(RESULTS / "plan_cpu_steptime.json")
    link = plan_validate.Link("test", 1e9, 0.0)
    requests = [[plan_validate.SimRequest("a", 0.0, 1500, 8)], [plan_validate.SimRequest("b", 0.0, 600, 8)]]
    cfg = plan_validate.serving_cluster("symmetric", model, link)
    predicted = [model.prefill_s(1024, cfg.prefill_role, 0) + model.prefill_s(476, cfg.prefill_role, 1024),
                 model.prefill_s(600, cfg.prefill_role, 0)]
    entry = {"rates": [{"prefill_compute_s_per_request": 2 * p} for p in predicted]}
    factor = plan_validate.prefill_speed("symmetric", model, link, entry, requests)
    assert factor == pytest.approx(2.0, rel=1e-12)
    scaled = plan_validate.scaled_prefill(model, factor)
    assert scaled.prefill_full == pytest.approx(tuple(2 * c for c in model.prefill_full))
    assert scaled.decode_step_s([300] * 4, [8]) == model.decode_step_s([300] * 4, [8])
