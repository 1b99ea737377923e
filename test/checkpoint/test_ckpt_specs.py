"""Engram / DSpark tensor specs versus nemo-automodel's modules, and the on-disk layout per kind.

Shapes recorded from NVIDIA nemo-automodel 0.7.0 (.venv-oracle): DeepseekV41DSparkBackbone and
DeepseekV41Engram built once on the meta device with the released Flash config."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_asym.checkpoint.specs import (
    checkpoint_tensor_specs,
    disk_layout,
    dspark_tensor_specs,
    engram_tensor_specs,
    released_nbytes,
    scale_name,
)
from sglang_asym.config import V41Config
from sglang_asym.tensor_specs import TensorSpec, backbone_tensor_specs

# Recorded from the meta-device build: named_parameters + the two gate buffers
# (e_score_correction_bias = released `gate.bias`, bias_vl) per stage.
NEMO_DSPARK_PARAMS_PER_STAGE = {0: 4_772_152_438, 1: 4_693_504_118, 2: 4_759_705_974}
NEMO_DSPARK_GROUPED_EXPERTS = {"gate_and_up_projs": (128, 5120, 4608), "down_projs": (128, 2304, 5120)}
NEMO_DSPARK_NON_EXPERT = {  # nemo name -> shape, released names differ only by the mapping below
    "attn.wq_a.weight": (1280, 5120), "attn.wq_b.weight": (32768, 1280), "attn.wkv.weight": (512, 5120),
    "attn.wo_a.weight": (8192, 4096), "attn.wo_b.weight": (5120, 8192), "attn.sinks_param.weight": (64,),
    "attn.q_norm.weight": (1280,), "attn.kv_norm.weight": (512,), "ffn.gate.weight": (128, 5120),
    "ffn.shared_experts.gate_proj.weight": (2304, 5120), "ffn.shared_experts.down_proj.weight": (5120, 2304),
    "attn_hc.fn": (24, 20480), "attn_hc.base": (24,), "attn_hc.scale": (3,),
}
NEMO_DSPARK_STAGE_EXTRAS = {
    "mtp.0.main_proj.weight": (5120, 15360), "mtp.0.main_norm.weight": (5120,), "mtp.2.norm.weight": (5120,),
    "mtp.2.markov_head.embed.weight": (129280, 256), "mtp.2.markov_head.head.weight": (129280, 256),
    "mtp.2.confidence_head.proj.weight": (1, 5376),
}
RELEASED_NAME = {
    "attn.sinks_param.weight": "attn.attn_sink", "ffn.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "ffn.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight", "attn_hc.fn": "hc_attn_fn",
    "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
}
NEMO_ENGRAM = {"embed.weight": (384006168, 256), "wkv.weight": (25600, 6144), "q_weight": (4, 5120), "k_weight": (4, 5120)}


@pytest.fixture(scope="module")
def flash() -> V41Config:
    return V41Config.flash()


def test_dspark_matches_nemo_per_stage(flash):
    specs = {s.name: s for s in dspark_tensor_specs(flash)}
    for stage, params in NEMO_DSPARK_PARAMS_PER_STAGE.items():
        assert sum(s.numel for n, s in specs.items() if n.startswith(f"mtp.{stage}.")) == params
    for stage in range(3):
        for nemo_name, shape in NEMO_DSPARK_NON_EXPERT.items():
            assert specs[f"mtp.{stage}.{RELEASED_NAME.get(nemo_name, nemo_name)}"].shape == shape
        experts = [n for n in specs if n.startswith(f"mtp.{stage}.ffn.experts.")]
        assert len(experts) == 3 * NEMO_DSPARK_GROUPED_EXPERTS["down_projs"][0]
        e, h, two_inter = NEMO_DSPARK_GROUPED_EXPERTS["gate_and_up_projs"]
        assert specs[f"mtp.{stage}.ffn.experts.{e - 1}.w1.weight"].shape == (two_inter // 2, h)
        assert specs[f"mtp.{stage}.ffn.experts.0.w2.weight"].shape == NEMO_DSPARK_GROUPED_EXPERTS["down_projs"][1:][::-1]
    for name, shape in NEMO_DSPARK_STAGE_EXTRAS.items():
        assert specs[name].shape == shape
    assert not any(".compressor." in n or ".indexer." in n for n in specs)  # SWA-only draft blocks


def test_dspark_storage_kinds(flash):
    kinds = {s.name: s.kind for s in dspark_tensor_specs(flash)}
    assert kinds["mtp.0.main_proj.weight"] == "fp8"
    assert kinds["mtp.1.ffn.experts.5.w3.weight"] == "fp4"
    assert kinds["mtp.2.confidence_head.proj.weight"] == "fp32"
    assert kinds["mtp.2.markov_head.head.weight"] == "bf16"


def test_engram_matches_nemo(flash):
    specs = {s.name: s for s in engram_tensor_specs(flash)}
    assert len(specs) == 8
    for layer, rows in ((1, 384006168), (14, 384016682)):
        for name, shape in NEMO_ENGRAM.items():
            expected = (rows, 256) if name == "embed.weight" else shape
            assert specs[f"layers.{layer}.engram.{name}"].shape == expected
    table = specs["layers.1.engram.embed.weight"]
    assert table.kind == "fp8_rows"
    assert released_nbytes(table) == 384006168 * 256 + 384006168 * 8  # FP8 [rows, 256] + e8m0 [rows, 8]


def test_checkpoint_specs_are_backbone_then_extras(flash):
    names = [s.name for s in checkpoint_tensor_specs(flash)]
    assert len(names) == len(set(names))
    backbone = [s.name for s in backbone_tensor_specs(flash)]
    assert names[: len(backbone)] == backbone
    assert names[len(backbone)].startswith("layers.1.engram.") and names[-1].startswith("mtp.2.")


@pytest.mark.parametrize(
    ("kind", "shape", "precision", "expected"),
    [
        ("fp8", (70, 100), "release", [("w.weight", (70, 100), torch.float8_e4m3fn), ("w.scale", (3, 4), torch.float8_e8m0fnu)]),
        ("fp4", (64, 96), "release", [("w.weight", (64, 48), torch.int8), ("w.scale", (64, 3), torch.float8_e8m0fnu)]),
        ("fp8_rows", (5, 256), "release", [("w.weight", (5, 256), torch.float8_e4m3fn), ("w.scale", (5, 8), torch.float8_e8m0fnu)]),
        ("bf16", (7,), "release", [("w.weight", (7,), torch.bfloat16)]),
        ("fp32", (3, 4), "release", [("w.weight", (3, 4), torch.float32)]),
        ("fp8", (64, 64), "bf16", [("w.weight", (64, 64), torch.bfloat16)]),
        ("fp32", (3, 4), "bf16", [("w.weight", (3, 4), torch.float32)]),
        ("fp4", (64, 64), "fp32", [("w.weight", (64, 64), torch.float32)]),
    ],
)
def test_disk_layout(kind, shape, precision, expected):
    layout = disk_layout(TensorSpec("w.weight", shape, kind), precision)
    assert [(t.name, t.shape, t.dtype) for t in layout] == expected
    if precision == "release":
        assert released_nbytes(TensorSpec("w.weight", shape, kind)) == sum(
            math.prod(s) * d.itemsize for _, s, d in expected
        )


def test_scale_name_follows_sglang_loader():
    # SGLang 0.5.23 remap: `...attn.wq_a.scale` -> `...self_attn.wq_a.weight_scale_inv`
    assert scale_name("layers.3.attn.wq_a.weight") == "layers.3.attn.wq_a.scale"
    assert scale_name("layers.3.ffn.experts.7.w2.weight") == "layers.3.ffn.experts.7.w2.scale"
    with pytest.raises(ValueError, match="only `.weight` tensors carry scales"):
        scale_name("layers.3.hc_attn_fn")
