"""Footprint accounting for Flash (from specs, nothing allocated) and the CLI's real-load report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_asym.checkpoint.accounting import PARTS, part_of, part_tallies, partition
from sglang_asym.config import V41Config
from sglang_asym.footprint import (
    FitAssumptions,
    footprint_report,
    global_kv_bytes_per_token,
    index_key_row_bytes,
    main_kv_row_bytes,
    swa_row_bytes,
)
from sglang_asym.layer_plan import LayerPlan
from sglang_asym.tensor_specs import backbone_tensor_specs


@pytest.fixture(scope="module")
def flash_report() -> dict:
    return footprint_report(V41Config.flash(), "flash")


def test_totals_match_published_counts(flash_report):
    full = flash_report["full"]
    assert abs(full["backbone"]["params"] / 552e9 - 1) < 0.01
    assert abs(full["total"]["params"] / 763e9 - 1) < 0.01
    assert full["backbone"]["params"] == 551_566_180_464  # exact, from tensor_specs
    assert full["dspark"]["params"] == 14_225_362_530  # nemo meta build, test_ckpt_specs.py
    assert full["engram"]["params"] == 2 * (25600 * 6144 + 2 * 4 * 5120) + 256 * (384006168 + 384016682)


def test_prefill_role_is_half_the_backbone(flash_report):
    ratio = flash_report["prefill_over_full_backbone"]
    assert ratio["params"] <= 0.505 and ratio["bytes"] <= 0.505 and ratio["ok"] is True
    assert ratio["params"] > 0.495 and ratio["bytes"] > 0.49
    parts = flash_report["parts"]
    assert parts["kv_source_kv_path"]["params"] == 2_692_736  # "about 2.7M parameters"
    assert parts["kv_source_kv_path"]["tensors"] == 5 and parts["kv_source_kv_path"]["layers"] == [20, 20]
    assert parts["encoder_layers"]["layers"] == [0, 19] and parts["decoder_layers"]["layers"] == [21, 39]
    prefill = flash_report["prefill_role"]["backbone"]
    assert prefill["params"] == sum(parts[p]["params"] for p in ("embeddings", "encoder_layers", "kv_source_kv_path"))
    prefill_names = LayerPlan.from_config(V41Config.flash()).prefill_tensor_names
    assert prefill["params"] == sum(s.numel for s in backbone_tensor_specs(V41Config.flash()) if s.name in prefill_names)


def test_released_bytes_per_part(flash_report):
    parts = flash_report["parts"]
    assert parts["embeddings"]["bytes"] == 129280 * 5120 * 2  # bf16
    assert parts["final_norm_and_head"]["bytes"] == 5120 * 2 + 129280 * 5120 * 4  # bf16 norm + fp32 head
    # one routed expert matrix 2304 x 5120 at fp4: half a byte per weight + one scale per 32 columns
    per_expert_matrix = 2304 * 5120 // 2 + 2304 * 5120 // 32
    assert parts["decoder_layers"]["bytes"] > 19 * 384 * 3 * per_expert_matrix
    assert sum(p["bytes"] for p in parts.values()) == flash_report["full"]["total"]["bytes"]


def test_every_tensor_lands_in_one_part():
    cfg = V41Config.small()
    parts = partition(cfg)
    assert set(parts) == set(PARTS)
    names = [s.name for specs in parts.values() for s in specs]
    assert len(names) == len(set(names))
    plan = LayerPlan.from_config(cfg)
    assert {s.name for p in ("embeddings", "encoder_layers", "kv_source_kv_path") for s in parts[p]} == plan.prefill_tensor_names
    with pytest.raises(ValueError, match="belongs to no footprint part"):
        part_of("vision.blocks.0.weight", plan)
    assert part_tallies(cfg)["engram"].params == 0


def test_kv_row_formats():
    cfg = V41Config.flash()
    assert (main_kv_row_bytes(cfg), index_key_row_bytes(cfg), swa_row_bytes(cfg)) == (288, 68, 528)
    assert global_kv_bytes_per_token(cfg) == 890


def test_fit_per_gpu(flash_report):
    fit = flash_report["fit"]
    prefill, full = fit["prefill_replica"], fit["full_replica"]
    assert prefill["weight_bytes_on_gpu"] == flash_report["prefill_role"]["backbone"]["bytes"] + prefill["engram_bytes_on_gpu"]
    assert prefill["kv_global_bytes_per_token"] == 890
    assert prefill["swa_layers"] == 20 and full["swa_layers"] == 43
    # ~149.5 GB of prefill weights: over one H200 (141 GB), inside one B300 or one GB200
    assert [prefill["gpus"][g]["fits_on_one_gpu"] for g in ("H200", "B300", "GB200")] == [False, True, True]
    assert prefill["gpus"]["H200"]["min_gpus_for_budget"] == 2
    # the full model fits on no single GPU
    assert not any(full["gpus"][g]["fits_on_one_gpu"] for g in ("H200", "B300", "GB200"))
    b300 = prefill["gpus"]["B300"]["by_gpu_count"]["1"]
    assert b300["free_for_kv_bytes"] == 288_000_000_000 - prefill["weight_bytes_on_gpu"] - 12_000_000_000
    assert b300["max_prompt_tokens"] == (b300["free_for_kv_bytes"] - prefill["swa_and_tail_state_bytes"]) // 890
    with_tables = footprint_report(V41Config.flash(), "flash", FitAssumptions(engram_tables_on_gpu=True))
    assert not with_tables["fit"]["prefill_replica"]["gpus"]["GB200"]["fits_on_one_gpu"]
    with pytest.raises(ValueError, match="gpu_counts"):
        FitAssumptions(gpu_counts=(2, 4))


def test_cli_prints_one_json_object():
    proc = subprocess.run([sys.executable, "-m", "sglang_asym.footprint", "--config", "flash"],
                          capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(proc.stdout)
    assert report["config"] == "flash" and report["prefill_over_full_backbone"]["ok"] is True


def test_cli_real_load_report(tiny_release_sharded):
    runs = {}
    for role in ("prefill", "decode"):
        proc = subprocess.run(
            [sys.executable, "-m", "sglang_asym.footprint", "--checkpoint", str(tiny_release_sharded), "--role", role],
            capture_output=True, text=True, timeout=120, check=True,
        )
        runs[role] = json.loads(proc.stdout)
    cfg = V41Config.tiny()
    plan = LayerPlan.from_config(cfg)
    specs = {s.name: s for s in backbone_tensor_specs(cfg)}
    for role, names in (("prefill", plan.prefill_tensor_names), ("decode", set(plan.all_tensor_names))):
        r = runs[role]
        quantized = sum(specs[n].kind in ("fp8", "fp4") for n in names)
        assert r["tensors_loaded"] == len(names) and r["tensors_read"] == len(names) + quantized
        assert r["loaded_bytes"] == 4 * sum(specs[n].numel for n in names)
        assert r["peak_rss_bytes"] >= r["rss_before_load_bytes"] > 50_000_000
    assert runs["prefill"]["shards_opened"] == ["model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors"]
    assert runs["prefill"]["bytes_read"] < runs["decode"]["bytes_read"]
