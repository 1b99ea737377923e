"""`python -m sglang_asym.plan.calibrate`: the measurement scripts/gpu_check.sh runs, dry-run on CPU against a named
GPU; its file read back by the planner; unknown GPUs and out-of-range fractions refused with no file written."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_asym.plan import calibrate as cal
from sglang_asym.plan.calibration import ENV, SCHEMA, load_efficiency
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.gpu_model import Efficiency
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.planner import PlanOptions, plan
from sglang_asym.plan.sim import Slo
from sglang_asym.plan.transfer_model import Mode
from sglang_asym.plan.workload import preset

SMALL = ["--copy-bytes", str(8 << 20), "--gemv-out", "512", "--gemv-in", "512", "--gemm-dim", "128", "--repeats", "3"]


def test_cpu_run_writes_entries_the_planner_reads(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "calibration.json"
    assert cal.main(["--device", "cpu", "--gpu", "H100", "--out", str(out), *SMALL]) == 0
    assert cal.main(["--device", "cpu", "--gpu", "b200", "--out", str(out), *SMALL]) == 0  # adds, keeps H100
    assert "calibrate: B200 mbu" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["schema"] == SCHEMA and sorted(data["gpus"]) == ["B200", "H100"]
    entry = data["gpus"]["H100"]
    assert 0 < entry["mbu"] < 0.5 and 0 < entry["mfu"] < 0.5  # two CPU cores are nowhere near an H100
    assert entry["measured"].startswith("sglang_asym.plan.calibrate on cpu (")
    assert "float32, medians of 3: gemv [16x512]x[512x512]" in entry["measured"]
    assert "gemm 128^3" in entry["measured"] and "step/prefill overheads assumed" in entry["measured"]
    assert (entry["step_overhead_s"], entry["prefill_overhead_s"]) == (Efficiency().step_overhead_s,
                                                                       Efficiency().prefill_overhead_s)

    loaded = load_efficiency("H100", out)
    assert loaded.efficiency == Efficiency(mbu=entry["mbu"], mfu=entry["mfu"])
    assert loaded.source == f"{out} [H100]: {entry['measured']}"
    # the planner finds the file through $SGLANG_ASYM_PLAN_CALIBRATION (what the README tells operators to set)
    monkeypatch.setenv(ENV, str(out))
    slow = plan(preset("chat"), 0.001, Slo(1e7, 1e5), gpu("H100"), Mode.ASYM,
                PlanOptions(sample_requests=100, placement="any"))
    assert slow["efficiency"] == {**loaded.efficiency.__dict__, "source": loaded.source}


@pytest.mark.parametrize(("device_name", "table_name"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA H800", "H800"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200-NVL72"), ("NVIDIA B300 SXM6 AC", "B300")])
def test_device_names_map_to_the_table(device_name, table_name) -> None:
    assert cal.gpu_for_device_name(device_name).name == table_name


@pytest.mark.parametrize("device_name", ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                                         "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090"])
def test_other_parts_are_refused(device_name) -> None:
    with pytest.raises(PlanInputError, match="is not in the planner's table"):
        cal.gpu_for_device_name(device_name)


def test_refusals_write_no_file(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "calibration.json"
    assert cal.main(["--device", "cpu", "--gpu", "A100", "--out", str(out), *SMALL]) == 2
    assert "unknown GPU 'A100'" in capsys.readouterr().err
    assert cal.main(["--device", "cpu", "--out", str(out), *SMALL]) == 2
    assert "--gpu auto reads the CUDA device's name" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cal.main(["--device", "cuda", "--out", str(out)]) == 2
    assert "no CUDA device visible to torch; no calibration written" in capsys.readouterr().err
    assert cal.main(["--device", "cpu", "--gpu", "H100", "--out", str(out), "--repeats", "0"]) == 2
    assert "repeats must be an int >= 1" in capsys.readouterr().err
    assert not out.exists()


def test_fractions_outside_0_1_are_refused(tmp_path, monkeypatch, capsys) -> None:
    h100 = gpu("H100")
    sizes = cal.SIZES["cpu"]
    fits = cal.Measurement("NVIDIA H100 80GB HBM3", "bfloat16", 3e12, 0.5 * h100.hbm_bytes_per_s,
                           0.25 * h100.bf16_flops, sizes)
    assert cal.efficiency_from(fits, h100) == Efficiency(mbu=0.5, mfu=0.25)
    too_fast = cal.Measurement("NVIDIA B200", "bfloat16", 7e12, 6e12, 1.5e15, sizes)  # a B200 measured, H100 named
    with pytest.raises(PlanInputError, match=r"measured mbu 1.79 of H100's peak is outside \(0, 1\]: "
                                             r"'NVIDIA B200' is not a H100"):
        cal.efficiency_from(too_fast, h100)
    with pytest.raises(PlanInputError, match=r"measured mfu 1.52 of H100's peak"):
        cal.efficiency_from(cal.Measurement("x", "bfloat16", 1e12, 1e12, 1.5e15, sizes), h100)
    with pytest.raises(PlanInputError, match=r"measured mbu 0 of H100's peak"):
        cal.efficiency_from(cal.Measurement("x", "bfloat16", 0.0, 0.0, 1e12, sizes), h100)
    # through the command: the measurement stands in for a run on the wrong part, and nothing is written
    out = tmp_path / "calibration.json"
    monkeypatch.setattr(cal, "measure", lambda device, sizes: too_fast)
    assert cal.main(["--device", "cpu", "--gpu", "H100", "--out", str(out)]) == 2
    assert "is not a H100; no calibration written" in capsys.readouterr().err and not out.exists()
