"""Released DeepSeek-V4.1 checkpoint tensor names -> the SGLang 0.5.23 parameter each one loads into.

Two steps, as SGLang's `DeepseekV4ForCausalLM.load_weights` takes them:
1. `sglang_name`: the rename (`embed.` -> `model.embed_tokens.`, `head.` -> `lm_head.`,
   `layers.N.attn.` -> `model.layers.N.self_attn.`, `.ffn.` -> `.mlp.`, `attn_norm` / `ffn_norm`
   -> `input_layernorm` / `post_attention_layernorm`, `w1/w2/w3` -> `gate/down/up_proj`,
   `gate.bias` -> `gate.e_score_correction_bias`, a quantized weight's `.scale` ->
   `.weight_scale_inv`). A canary test compares it with SGLang's own
   `remap_weight_name_to_dpsk_hf_format` on every released name.
2. `load_target`: where the renamed tensor lands, given the model's parameter names: routed
   experts stack into `experts.w13_weight` / `experts.w2_weight` (per expert and shard), the
   shared expert's gate/up into `gate_up_proj`, and, when the model has the fused parameters,
   `wq_a` + `wkv` into `wqkv_a` and a compressor's `wkv` + `wgate` into `wkv_gate`. When the
   model keeps `wo_a` in bf16 (SGLang's fp8 wo_a GEMM takes 128x128 blocks only; V4.1 ships
   32x32), the loader dequantizes `wo_a.weight` with its `wo_a.scale` into the bf16 `wo_a.weight`.
Tensors SGLang drops for a text-only V4.1 (`gate.bias_vl`, vision) map to None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection

_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<leaf>.+)$")
_EXPERT_PARAM = {"gate_proj": ("w13", "w1"), "up_proj": ("w13", "w3"), "down_proj": ("w2", "w2")}
_EXPERT_LEAF = {"weight": "weight", "weight_scale_inv": "weight_scale_inv"}
_SHARED_GATE_UP = re.compile(r"^(?P<prefix>.*\.mlp\.shared_experts)\.(?P<proj>gate_proj|up_proj)\.(?P<leaf>.+)$")
_ATTN_A = re.compile(r"^(?P<prefix>.*\.self_attn)\.(?P<proj>wq_a|wkv)\.(?P<leaf>weight|weight_scale_inv)$")
_COMPRESSOR = re.compile(r"^(?P<prefix>.*\.compressor)\.(?P<proj>wkv|wgate)\.weight$")
_WO_A_SCALE = ".self_attn.wo_a.weight_scale_inv"
_DROPPED_SUFFIXES = (".gate.e_score_correction_bias_vl",)


@dataclass(frozen=True)
class LoadTarget:
    """The SGLang parameter a checkpoint tensor fills, and which part of it."""

    param: str
    # "w1"/"w2"/"w3" (experts), "gate"/"up" (shared expert), "q"/"kv" (wqkv_a), "kv"/"gate"
    # (wkv_gate), "dequant_scale" (a scale folded into a bf16 weight at load)
    shard: str | None = None
    expert: int | None = None


def sglang_name(name: str) -> str:
    """Step 1: the released name in SGLang's (HF DeepSeek) naming."""
    if name.startswith("embed."):
        return "model.embed_tokens." + name.removeprefix("embed.")
    if name.startswith("head."):
        return "lm_head." + name.removeprefix("head.")
    if name == "norm.weight":
        return "model.norm.weight"
    if name.startswith("hc_head_"):
        return "model." + name
    if name.startswith("layers."):
        name = "model." + name
    for old, new in ((".attn.", ".self_attn."), (".ffn.", ".mlp."), (".attn_norm.", ".input_layernorm."),
                     (".ffn_norm.", ".post_attention_layernorm.")):
        name = name.replace(old, new)
    quantized_scale = name.endswith(".scale") and (
        "self_attn" in name or "mlp" in name or ".engram.wkv." in name
    )
    name = name.replace(".gate.bias", ".gate.e_score_correction_bias")
    name = name.replace(".w1.", ".gate_proj.").replace(".w2.", ".down_proj.").replace(".w3.", ".up_proj.")
    if quantized_scale:
        name = name.removesuffix(".scale") + ".weight_scale_inv"
    return name


def load_target(name: str, params: Collection[str]) -> LoadTarget | None:
    """Step 2 for a released name; None when SGLang drops the tensor. Raises KeyError when the
    tensor has no parameter to go to (a mapping or model mismatch, never silent)."""
    renamed = sglang_name(name)
    if renamed.endswith(_DROPPED_SUFFIXES):
        return None
    m = _EXPERT.match(renamed)
    if m:
        stack, shard = _EXPERT_PARAM[m["proj"]]
        target = LoadTarget(f"{m['prefix']}.{stack}_{_EXPERT_LEAF[m['leaf']]}", shard, int(m["expert"]))
    elif (m := _SHARED_GATE_UP.match(renamed)) and f"{m['prefix']}.gate_up_proj.{m['leaf']}" in params:
        target = LoadTarget(f"{m['prefix']}.gate_up_proj.{m['leaf']}", "gate" if m["proj"] == "gate_proj" else "up")
    elif (m := _ATTN_A.match(renamed)) and f"{m['prefix']}.wqkv_a.{m['leaf']}" in params:
        target = LoadTarget(f"{m['prefix']}.wqkv_a.{m['leaf']}", "q" if m["proj"] == "wq_a" else "kv")
    elif renamed.endswith(_WO_A_SCALE) and renamed not in params:
        target = LoadTarget(renamed.removesuffix("_scale_inv"), "dequant_scale")
    elif (m := _COMPRESSOR.match(renamed)) and f"{m['prefix']}.wkv_gate.weight" in params:
        target = LoadTarget(f"{m['prefix']}.wkv_gate.weight", "kv" if m["proj"] == "wkv" else "gate")
    else:
        target = LoadTarget(renamed)
    if target.param not in params:
        raise KeyError(f"checkpoint tensor {name!r} maps to {target.param!r}, which the SGLang model does not have")
    return target
