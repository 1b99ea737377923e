"""`compare`: asym vs SGLang's default symmetric PD per grid cell, the verdict rule, and the placement fallback."""

from __future__ import annotations

import json

import pytest

from sglang_asym.plan.cli import main
from sglang_asym.plan.compare import CompareGrid, compare, plot_compare
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpu_model import Efficiency
from sglang_asym.plan.planner import PlanOptions

OPTIONS = PlanOptions(efficiency=Efficiency(), sample_requests=400)


def test_compare_cells_and_verdicts(tmp_path) -> None:
    grid = CompareGrid(("chat",), (5.0,), ((1.5, 0.06),), ("H100", "B300"))
    report = compare(grid, OPTIONS)
    assert len(report["cells"]) == 2 and "bounded replay" in report["baseline"]
    for cell in report["cells"]:
        asym, sym = cell["asym"], cell["symmetric"]
        key = lambda s: (s["gpus_in_domains"], s["gpus_used"], s["ttft_p99_ms"])  # noqa: E731
        assert cell["winner"] == ("asym" if key(asym) < key(sym) else "symmetric" if key(sym) < key(asym) else "tie")
        assert cell["gpus_used_saved"] == sym["gpus_used"] - asym["gpus_used"]
        assert cell["ttft_p99_ratio"] == round(asym["ttft_p99_ms"] / sym["ttft_p99_ms"], 4)
        assert asym["itl_p99_ms"] <= 60.0 and sym["itl_p99_ms"] <= 60.0
    h100 = next(c for c in report["cells"] if c["gpu"] == "H100")
    # an 8-GPU D replica plus a P replica exceeds one 8-GPU H100 board: placed across domains instead
    assert h100["asym"]["placement"] == h100["symmetric"]["placement"] == "any"
    b300 = next(c for c in report["cells"] if c["gpu"] == "B300")
    assert b300["asym"]["placement"] == "same-domain"
    assert report["per_gpu"]["B300"]["cells"] == 1
    png = plot_compare(report, tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_cli_and_bad_grid(capsys) -> None:
    assert main(["compare", "--workloads", "chat", "--rates", "5", "--slo", "1500:60", "--gpus", "B300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grid"]["slos"] == [{"ttft_ms": 1500.0, "itl_ms": 60.0}] and len(out["cells"]) == 1
    assert main(["compare", "--slo", "1500-60", "--gpus", "B300"]) == 2
    assert "TTFT_MS:ITL_MS" in capsys.readouterr().err
    with pytest.raises(PlanInputError, match="unknown GPU"):
        CompareGrid(gpus=("A100",))
