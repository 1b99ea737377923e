"""The released checkpoint's backbone tensors for any V41Config: name, shape and storage kind.

Names follow the released DeepSeek-V4.1-Flash safetensors (`embed.weight`, `head.weight`,
`layers.{i}.attn.compressor.wkv.weight`, `layers.{i}.ffn.experts.{j}.w1.weight`,
`layers.{i}.hc_attn_fn`, ...). Engram tables, the DSpark draft (`mtp.*`) and vision are not
part of the backbone and are listed by the footprint accounting, not here.

Storage kinds (released on-disk precision):
  fp8     E4M3 with float8_e8m0fnu scales over 32x32 blocks (`.scale` beside the weight)
  fp4     routed experts: E2M1 packed two per int8, e8m0 scale per row and 32 columns
  bf16    norms, embeddings, router weight, indexer key path and head-mixer
  fp32    mHC mixers, attention sinks, compressor projections, router biases, lm head
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .config import V41Config


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def layer_of(name: str) -> int | None:
    """Layer index of a `layers.{i}.` tensor name, None for top-level tensors."""
    m = re.match(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def layer_tensor_specs(cfg: V41Config, i: int) -> list[TensorSpec]:
    h, hc = cfg.hidden_size, cfg.hc_mult
    mix = hc * (hc + 2)
    p = f"layers.{i}."
    specs = [
        TensorSpec(p + "attn_norm.weight", (h,), "bf16"),
        TensorSpec(p + "ffn_norm.weight", (h,), "bf16"),
    ]
    for site in ("attn", "ffn"):
        specs += [
            TensorSpec(p + f"hc_{site}_fn", (mix, hc * h), "fp32"),
            TensorSpec(p + f"hc_{site}_base", (mix,), "fp32"),
            TensorSpec(p + f"hc_{site}_scale", (3,), "fp32"),
        ]
    a = p + "attn."
    heads_dim = cfg.num_attention_heads * cfg.head_dim
    specs += [
        TensorSpec(a + "wq_a.weight", (cfg.q_lora_rank, h), "fp8"),
        TensorSpec(a + "q_norm.weight", (cfg.q_lora_rank,), "bf16"),
        TensorSpec(a + "wq_b.weight", (heads_dim, cfg.q_lora_rank), "fp8"),
        TensorSpec(a + "wkv.weight", (cfg.head_dim, h), "fp8"),
        TensorSpec(a + "kv_norm.weight", (cfg.head_dim,), "bf16"),
        TensorSpec(a + "wo_a.weight", (cfg.o_groups * cfg.o_lora_rank, heads_dim // cfg.o_groups), "fp8"),
        TensorSpec(a + "wo_b.weight", (h, cfg.o_groups * cfg.o_lora_rank), "fp8"),
        TensorSpec(a + "attn_sink", (cfg.num_attention_heads,), "fp32"),
    ]
    ratio = cfg.compress_ratios[i]
    if i in cfg.kv_source_layer_ids:
        specs += [
            TensorSpec(a + "compressor.wkv.weight", (cfg.head_dim, h), "fp32"),
            TensorSpec(a + "compressor.norm.weight", (cfg.head_dim,), "bf16"),
        ]
        if ratio > 1:
            specs.append(TensorSpec(a + "compressor.wgate.weight", (cfg.head_dim, h), "fp32"))
    if i in cfg.index_source_layer_ids:
        specs += [
            TensorSpec(a + "indexer.wq_b.weight", (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank), "fp8"),
            TensorSpec(a + "indexer.weights_proj.weight", (cfg.index_n_heads, h), "bf16"),
        ]
        if i in cfg.kv_source_layer_ids:
            specs += [
                TensorSpec(a + "indexer.wk.weight", (cfg.index_head_dim, cfg.head_dim), "bf16"),
                TensorSpec(a + "indexer.k_norm.weight", (cfg.index_head_dim,), "bf16"),
            ]
    f = p + "ffn."
    e, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
    specs += [
        TensorSpec(f + "gate.weight", (e, h), "bf16"),
        TensorSpec(f + "gate.bias", (e,), "fp32"),
        TensorSpec(f + "gate.bias_vl", (e,), "fp32"),
    ]
    for j in range(e):
        specs += [
            TensorSpec(f + f"experts.{j}.w1.weight", (inter, h), "fp4"),
            TensorSpec(f + f"experts.{j}.w2.weight", (h, inter), "fp4"),
            TensorSpec(f + f"experts.{j}.w3.weight", (inter, h), "fp4"),
        ]
    specs += [
        TensorSpec(f + "shared_experts.w1.weight", (inter, h), "fp8"),
        TensorSpec(f + "shared_experts.w2.weight", (h, inter), "fp8"),
        TensorSpec(f + "shared_experts.w3.weight", (inter, h), "fp8"),
    ]
    return specs


def backbone_tensor_specs(cfg: V41Config) -> list[TensorSpec]:
    """Every backbone tensor of the released checkpoint, in a stable order."""
    specs = [TensorSpec("embed.weight", (cfg.vocab_size, cfg.hidden_size), "bf16")]
    for i in range(cfg.num_hidden_layers):
        specs += layer_tensor_specs(cfg, i)
    specs += [
        TensorSpec("norm.weight", (cfg.hidden_size,), "bf16"),
        TensorSpec("head.weight", (cfg.vocab_size, cfg.hidden_size), "fp32"),
    ]
    return specs
