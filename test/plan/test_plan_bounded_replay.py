"""The planner's symmetric PD is SGLang's GPU default (bounded replay), the full-compute baseline is kept only under
its own label; one weight layout serves memory and step time; RFC #57738's P holds the full model; decode batches
are bounded by HBM; the ITL search tries every D size; efficiencies come from a calibration file."""

from __future__ import annotations

import json

import pytest

from sglang_asym.checkpoint.accounting import part_tallies
from sglang_asym.config import V41Config
from sglang_asym.footprint import engram_bytes
from sglang_asym.plan.calibration import SCHEMA, load_efficiency, write_calibration
from sglang_asym.plan.cli import main
from sglang_asym.plan.errors import PlanInputError
from sglang_asym.plan.flash_profile import flash_profile
from sglang_asym.plan.gpu_model import Efficiency, GpuStepModel
from sglang_asym.plan.gpus import gpu
from sglang_asym.plan.memory import min_replica_gpus, replica_fit
from sglang_asym.plan.planner import PlanOptions, plan
from sglang_asym.plan.replica_layout import ReplicaLayout
from sglang_asym.plan.sim import Slo
from sglang_asym.plan.steptime import Role
from sglang_asym.plan.transfer_model import Mode, payload_bytes
from sglang_asym.plan.workload import preset

H200 = gpu("H200")
SLO = Slo(1.5, 0.06)
ASSUMED = PlanOptions(efficiency=Efficiency(), sample_requests=400)


@pytest.mark.parametrize("n", [1, 64, 128])
def test_bounded_replay_is_the_full_model_when_the_prompt_fits_the_window(n: int) -> None:
    model = GpuStepModel(H200, 4, Role.SYM_P)
    assert model.prefill_s(n, Role.SYM_P) == pytest.approx(model.prefill_s(n, Role.FULL), rel=1e-12)


@pytest.mark.parametrize("n", [512, 4096, 16384])
def test_bounded_replay_runs_late_layers_on_w_rows(n: int) -> None:
    model = GpuStepModel(H200, 4, Role.SYM_P)
    eff = model.efficiency
    early, late = model._prefill_part([(n, 0)], Role.RFC_P), model._prefill_part([(128, n - 128)], Role.LATE)
    assert early[1] == n / 4 and late[1] == 128 / 4
    assert model.prefill_s(n, Role.SYM_P) == model._step_parts([early, late], eff.prefill_overhead_s)
    assert model.prefill_s(n - 128, Role.ASYM_P) < model.prefill_s(n, Role.SYM_P) < model.prefill_s(n, Role.FULL)


def test_symmetric_mode_is_bounded_replay_and_the_full_baseline_is_labelled() -> None:
    sym = plan(preset("chat"), 20, SLO, H200, Mode.SYMMETRIC, ASSUMED)
    full = plan(preset("chat"), 20, SLO, H200, Mode.SYMMETRIC_FULL, ASSUMED)
    assert sym["prefill"]["role"] == "sym_p" and full["prefill"]["role"] == "full"
    assert sym["mode"] == "symmetric" and full["mode"] == "symmetric-full-compute"
    assert sym["prefill"]["seconds_per_mean_prompt"] < full["prefill"]["seconds_per_mean_prompt"]
    assert payload_bytes(Mode.SYMMETRIC, 4096) == payload_bytes(Mode.SYMMETRIC_FULL, 4096)


def test_memory_and_step_time_share_one_layout() -> None:
    cfg = V41Config()
    profile = flash_profile(cfg)
    for role, gpus in ((Role.FULL, 4), (Role.ASYM_P, 2), (Role.FULL, 8)):
        layout = ReplicaLayout(role, gpus)
        assert replica_fit(role, H200, gpus, 4096).weight_bytes_per_gpu == layout.weight_bytes_per_gpu
        assert GpuStepModel(H200, gpus, role).layout == layout
        # a step touching every expert reads the dense copy and this GPU's experts; what is resident but not read is
        # the embeddings, the Engram projections and (full replicas) the DSpark drafter
        read = GpuStepModel(H200, gpus, role).weight_read_bytes(role, 1e9)
        idle = profile.embed_bytes + engram_bytes(cfg)[1] + (part_tallies(cfg)["dspark"].bytes if role is Role.FULL
                                                               else part_tallies(cfg)["kv_source_kv_path"].bytes)
        assert layout.weight_bytes_per_gpu - read == pytest.approx(idle, abs=1)
    # dense weights are one copy per GPU (DP attention), experts split
    four, eight = ReplicaLayout(Role.FULL, 4), ReplicaLayout(Role.FULL, 8)
    assert four.replicated_bytes == eight.replicated_bytes
    assert four.weight_bytes_per_gpu - eight.weight_bytes_per_gpu == pytest.approx(four.expert_bytes / 8)


def test_rfc57738_prefill_holds_the_full_model() -> None:
    assert ReplicaLayout(Role.RFC_P, 4).weight_bytes_per_gpu == ReplicaLayout(Role.FULL, 4).weight_bytes_per_gpu
    assert min_replica_gpus(Role.ASYM_P, H200, 8192).gpus == 2
    assert min_replica_gpus(Role.RFC_P, H200, 8192).gpus == min_replica_gpus(Role.FULL, H200, 8192).gpus == 4
    rfc = plan(preset("chat"), 20, SLO, H200, Mode.RFC57738, ASSUMED)
    assert rfc["prefill"]["gpus_per_replica"] == 4 and rfc["memory"]["prefill_replica"]["weight_gb_per_gpu"] == \
        round(ReplicaLayout(Role.FULL, 4).weight_bytes_per_gpu / 1e9, 2)


def test_decode_batch_is_bounded_by_hbm_not_a_constant() -> None:
    loose = Slo(30.0, 1.0)  # an ITL no batch misses: memory alone limits the batch
    free = plan(preset("chat"), 20, loose, H200, Mode.SYMMETRIC, ASSUMED)
    dec, context = free["decode"], int(free["lengths"]["mean_prompt"] + free["lengths"]["mean_output"] / 2)
    fit = replica_fit(Role.FULL, H200, dec["gpus_per_replica"], context)
    assert dec["batch_limited_by"] == "kv_memory"
    assert dec["batch_per_rank"] == fit.max_requests_at_context // dec["gpus_per_replica"] > 128
    capped = plan(preset("chat"), 20, loose, H200, Mode.SYMMETRIC,
                  PlanOptions(efficiency=Efficiency(), sample_requests=400, max_running_per_rank=128))
    assert (capped["decode"]["batch_per_rank"], capped["decode"]["batch_limited_by"]) == (128, "max_running")


def test_itl_search_tries_every_decode_size(capsys) -> None:
    # the 2-GPU replica's floor (20.5 ms) misses 8 ms; a 16-GPU replica meets it: no exit 2 without --decode-gpus
    assert main(["plan", "--workload", "chat", "--rate", "20", "--gpu", "GB200", "--itl-ms", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decode"]["gpus_per_replica"] == 16 and out["decode"]["step_with_window_chunk_ms"] <= 8
    # where no size meets it, the largest replica's floor is the reason
    assert main(["plan", "--workload", "chat", "--rate", "20", "--gpu", "H200", "--itl-ms", "8"]) == 2
    assert "one decode step of a single request on 8 H200 takes 15.7 ms" in capsys.readouterr().err


def test_calibration_file_replaces_the_assumed_efficiencies(tmp_path) -> None:
    path = tmp_path / "calibration.json"
    write_calibration(path, "H200", Efficiency(mbu=0.5, mfu=0.3), "test run")
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["gpus"]["H200"]["mbu"] == 0.5
    measured = load_efficiency("H200", path)
    assert measured.efficiency == Efficiency(mbu=0.5, mfu=0.3) and "test run" in measured.source
    assert load_efficiency("B300", path).efficiency == Efficiency() and "no entry for B300" in load_efficiency(
        "B300", path).source
    base = PlanOptions(sample_requests=400)
    slow = plan(preset("chat"), 20, SLO, H200, Mode.ASYM, PlanOptions(sample_requests=400, calibration=str(path)))
    assumed = plan(preset("chat"), 20, SLO, H200, Mode.ASYM, base)
    assert slow["efficiency"]["mbu"] == 0.5 and assumed["efficiency"]["mbu"] == 0.7
    assert assumed["efficiency"]["source"].startswith("assumed")
    assert slow["throughput_per_gpu"]["decode_tokens_s"] < assumed["throughput_per_gpu"]["decode_tokens_s"]
    with pytest.raises(PlanInputError, match="does not exist"):
        load_efficiency("H200", tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text(json.dumps({"schema": SCHEMA, "gpus": {"H200": {"mbu": 0.5}}}))
    with pytest.raises(PlanInputError, match="needs numbers"):
        load_efficiency("H200", tmp_path / "bad.json")
    (tmp_path / "range.json").write_text(json.dumps({"schema": SCHEMA, "gpus": {"H200": {"mbu": 1.5, "mfu": 0.4}}}))
    with pytest.raises(PlanInputError, match="mbu must be in"):
        load_efficiency("H200", tmp_path / "range.json")
