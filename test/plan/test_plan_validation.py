"""The committed validation table is what benchmark/plan_validate.py computes from the committed fits and benchmarks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmark" / "results"


@pytest.fixture(scope="module")
def plan_validate():
    spec = importlib.util.spec_from_file_location("plan_validate", ROOT / "benchmark" / "plan_validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_rows_are_reproduced(plan_validate) -> None:
    committed = json.loads((RESULTS / "plan_validation.json").read_text())
    model = plan_validate.CpuStepModel.from_json(RESULTS / "plan_cpu_steptime.json")
    link = plan_validate.loopback_link(json.loads((RESULTS / "transfer.json").read_text()))
    speeds: dict = {}
    rows = plan_validate.validate_decode_itl(model) + plan_validate.validate_serving(model, link, speeds)
    assert rows == committed["rows"]
    assert speeds == committed["serving_prefill_speed"]
    assert committed["within_target"] == sum(r["within_target"] for r in rows) == 27 and len(rows) == 32


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
