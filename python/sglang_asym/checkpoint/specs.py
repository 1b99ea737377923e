"""Every tensor of the released checkpoint (backbone, Engram, DSpark) and its on-disk layout.

The backbone comes from sglang_asym.tensor_specs; this module adds the Engram memory
(`layers.{i}.engram.*`) and the DSpark draft (`mtp.{k}.*`), and how each tensor is laid out on disk
at a given precision. Engram and DSpark shapes follow NVIDIA nemo-automodel's DeepSeek-V4.1 modules
with the released config (read from their source and a meta-device build; see
test/checkpoint/test_ckpt_specs.py).
Storage kinds beyond the backbone's four (tensor_specs.py):
  fp8_rows  Engram tables: E4M3 with one e8m0 scale per row and 32 columns
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import V41Config
from ..tensor_specs import TensorSpec, backbone_tensor_specs, layer_tensor_specs
from . import formats

PRECISIONS = ("release", "bf16", "fp32")


def scale_name(weight_name: str) -> str:
    """`x.weight` -> `x.scale`, the name SGLang's V4 loader and nemo's adapter expect."""
    if not weight_name.endswith(".weight"):
        raise ValueError(f"only `.weight` tensors carry scales, got {weight_name!r}")
    return weight_name.removesuffix(".weight") + ".scale"


def engram_tensor_specs(cfg: V41Config) -> list[TensorSpec]:
    specs = []
    hash_heads = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
    for layer, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        p = f"layers.{layer}.engram."
        specs += [
            TensorSpec(p + "embed.weight", (rows, cfg.engram_head_dim), "fp8_rows"),
            # one projection yields the hc_mult keys and the value
            TensorSpec(p + "wkv.weight",
                       (cfg.hidden_size * (cfg.hc_mult + 1), hash_heads * cfg.engram_head_dim), "fp8"),
            TensorSpec(p + "q_weight", (cfg.hc_mult, cfg.hidden_size), "bf16"),
            TensorSpec(p + "k_weight", (cfg.hc_mult, cfg.hidden_size), "bf16"),
        ]
    return specs


def dspark_tensor_specs(cfg: V41Config) -> list[TensorSpec]:
    """The `mtp.{k}` draft blocks: SWA-only backbone-shaped layers with their own expert count,
    plus the input projection on block 0 and the final norm / Markov / confidence heads on the last."""
    n = cfg.num_nextn_predict_layers
    if n == 0:
        return []
    first_draft_layer = cfg.num_hidden_layers
    draft_ratios = cfg.compress_ratios[first_draft_layer:first_draft_layer + n]
    if len(draft_ratios) < n or any(draft_ratios):
        raise ValueError("compress_ratios must list ratio 0 for every DSpark draft layer after the backbone")
    draft_cfg = cfg.replace(
        n_routed_experts=cfg.dspark_n_routed_experts,
        num_experts_per_tok=min(cfg.dspark_num_experts_per_tok, cfg.dspark_n_routed_experts),
    )
    h = cfg.hidden_size
    specs = []
    for k in range(n):
        layer_prefix, draft_prefix = f"layers.{first_draft_layer + k}.", f"mtp.{k}."
        for s in layer_tensor_specs(draft_cfg, first_draft_layer + k):
            specs.append(TensorSpec(draft_prefix + s.name.removeprefix(layer_prefix), s.shape, s.kind))
        if k == 0:
            specs += [
                TensorSpec(draft_prefix + "main_proj.weight", (h, h * len(cfg.dspark_target_layer_ids)), "fp8"),
                TensorSpec(draft_prefix + "main_norm.weight", (h,), "bf16"),
            ]
        if k == n - 1:
            specs += [
                TensorSpec(draft_prefix + "norm.weight", (h,), "bf16"),
                TensorSpec(draft_prefix + "markov_head.embed.weight", (cfg.vocab_size, cfg.dspark_markov_rank), "bf16"),
                TensorSpec(draft_prefix + "markov_head.head.weight", (cfg.vocab_size, cfg.dspark_markov_rank), "bf16"),
                TensorSpec(draft_prefix + "confidence_head.proj.weight", (1, h + cfg.dspark_markov_rank), "fp32"),
            ]
    return specs


def checkpoint_tensor_specs(cfg: V41Config) -> list[TensorSpec]:
    """Backbone, then Engram, then DSpark: everything a released checkpoint holds (vision aside)."""
    return backbone_tensor_specs(cfg) + engram_tensor_specs(cfg) + dspark_tensor_specs(cfg)


@dataclass(frozen=True)
class DiskTensor:
    """One stored tensor: a weight or its scale."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


def disk_layout(spec: TensorSpec, precision: str) -> tuple[DiskTensor, ...]:
    """The stored tensor(s) for spec: at release precision a quantized weight plus its `.scale`;
    at bf16 every non-fp32 kind as bfloat16; at fp32 everything as float32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32" or spec.kind == "fp32":
        return (DiskTensor(spec.name, spec.shape, torch.float32),)
    if precision == "bf16" or spec.kind == "bf16":
        return (DiskTensor(spec.name, spec.shape, torch.bfloat16),)
    rows, cols = spec.shape
    scale = scale_name(spec.name)
    if spec.kind == "fp8":
        return (DiskTensor(spec.name, spec.shape, torch.float8_e4m3fn),
                DiskTensor(scale, formats.fp8_block_scale_shape(rows, cols), torch.float8_e8m0fnu))
    if spec.kind == "fp8_rows":
        return (DiskTensor(spec.name, spec.shape, torch.float8_e4m3fn),
                DiskTensor(scale, formats.row_scale_shape(rows, cols), torch.float8_e8m0fnu))
    if spec.kind == "fp4":
        return (DiskTensor(spec.name, formats.packed_fp4_shape(rows, cols), torch.int8),
                DiskTensor(scale, formats.row_scale_shape(rows, cols), torch.float8_e8m0fnu))
    raise ValueError(f"{spec.name}: unknown storage kind {spec.kind!r}")


def released_nbytes(spec: TensorSpec) -> int:
    """Bytes of spec at the released storage (weight plus scales)."""
    return sum(t.nbytes for t in disk_layout(spec, "release"))
