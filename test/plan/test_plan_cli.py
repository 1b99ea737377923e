"""`python -m sglang_asym.plan`: JSON out, the dry run's exit status and refusal line, bad input on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_asym.plan.cli import main


def test_share(capsys) -> None:
    assert main(["share", "--input-tokens", "20", "--output-tokens", "1", "--prefill-tokens-per-gpu", "12000",
                 "--decode-tokens-per-gpu", "800"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefill_share"] == pytest.approx(20 / 35)


def test_dry_run_refuses_in_the_operator_style(capsys) -> None:
    rc = main(["dry-run", "--domain-gpus", "8", "--prefill-gpus", "4", "--prefill-replicas", "2", "--decode-gpus", "64",
               "--decode-replicas", "1", "--stage", "prod-us", "--fleet", "h200-use1"])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    assert captured.err == "error  stage prod-us: fleet h200-use1 domain is 8 GPUs; serving unit needs 72 (same-domain)\n"


def test_dry_run_places_the_nvl72_unit(capsys) -> None:
    assert main(["dry-run", "--domain-gpus", "72", "--prefill-gpus", "4", "--prefill-replicas", "2",
                 "--decode-gpus", "64", "--decode-replicas", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["serving_unit"]["gpus"] == 72


def test_plan_all_modes(capsys) -> None:
    assert main(["plan", "--workload", "chat", "--rate", "20", "--gpu", "GB200", "--mode", "all"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out) == ["asym", "colocated", "rfc57738", "symmetric", "symmetric-full-compute"]
    assert out["asym"]["gpu"] == "GB200-NVL72" and out["rfc57738"]["rfc57738"].endswith("/57738")


@pytest.mark.parametrize("argv, message", [
    (["plan", "--workload", "chat", "--rate", "-3", "--gpu", "B300"], "--rate must be > 0"),
    (["plan", "--workload", "chat", "--rate", "3", "--gpu", "MI300"], "unknown GPU 'MI300'"),
    (["plan", "--rate", "3", "--gpu", "B300"], "needs --workload PRESET or both --input-mean and --output-mean"),
    (["plan", "--workload", "chat", "--rate", "3", "--gpu", "B300", "--itl-ms", "0.1"], "below the physical floor"),
    (["share", "--input-tokens", "1", "--output-tokens", "1", "--prefill-tokens-per-gpu", "0",
      "--decode-tokens-per-gpu", "1"], "prefill tokens per GPU per second must be > 0"),
])
def test_bad_input_exit_2(capsys, argv, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_module_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "sglang_asym.plan", "gpus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and sorted(json.loads(proc.stdout)) == ["B200", "B300", "GB200-NVL72", "GB300-NVL72",
                                                                             "H100", "H200", "H800"]


def test_steptime_and_custom_workload(capsys) -> None:
    assert main(["steptime", "--gpu", "B300", "--gpus", "8", "--batch", "64", "--context", "4096", "--window-rows", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decode_step_ms"] > 0 and out["prefill_tokens_per_gpu_s"]["asym_p"] > out["prefill_tokens_per_gpu_s"]["full"]
    assert main(["plan", "--input-mean", "6000", "--output-mean", "800", "--rate", "5", "--gpu", "B300",
                 "--placement", "any"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["workload"] == "custom" and plan["transfer"]["link"] == "rdma"
    assert main(["plan", "--workload", "chat", "--input-mean", "10", "--output-mean", "10", "--rate", "5",
                 "--gpu", "B300"]) == 2
    assert "not both" in capsys.readouterr().err


def test_simulate_and_plot(capsys, tmp_path) -> None:
    png = tmp_path / "plans.png"
    assert main(["plan", "--workload", "chat", "--rate", "20", "--gpu", "B300", "--mode", "all", "--simulate",
                 "--sim-requests", "30", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 10_000
    q = out["asym"]["simulation"]["quantiles"]
    assert q["q"] == [1, 5, 10, 25, 50, 75, 90, 95, 99] and q["ttft_s"] == sorted(q["ttft_s"])
    assert main(["plan", "--workload", "chat", "--rate", "20", "--gpu", "B300", "--plot", str(png)]) == 2
    assert "--plot needs --simulate" in capsys.readouterr().err
