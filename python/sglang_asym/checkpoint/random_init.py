"""Deterministic random weights for any V41Config, keyed by released tensor names.

Each tensor draws from its own generator seeded by (seed, name), so a tensor's values do not depend
on which other tensors are generated (a shard, a role, or the whole model). Scales keep activations
O(1): norms near 1, projections N(0, 1/fan_in), residual-writing projections further damped by
1/sqrt(num_layers), mHC base 0 / scale 1, small sinks and router biases, unit-variance embeddings.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable

import torch

from ..config import V41Config
from ..tensor_specs import TensorSpec, backbone_tensor_specs
from . import formats
from .specs import PRECISIONS, checkpoint_tensor_specs

# Projections whose output is added back into the residual streams.
_RESIDUAL_WRITERS = ("attn.wo_b.weight", ".w2.weight")


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _normal(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32).mul_(std)


def random_tensor(spec: TensorSpec, cfg: V41Config, seed: int) -> torch.Tensor:
    """The float32 value of one tensor, before any storage rounding."""
    g = torch.Generator().manual_seed(_tensor_seed(seed, spec.name))
    name, shape = spec.name, spec.shape
    if name.endswith("norm.weight"):
        return _normal(shape, 0.05, g).add_(1.0)
    if name.endswith(("_base", "gate.bias_vl")):
        return torch.zeros(shape)
    if name.endswith(("_scale", "engram.q_weight", "engram.k_weight")):
        return torch.ones(shape)
    if name.endswith("attn.attn_sink"):
        return _normal(shape, 0.1, g)
    if name.endswith("gate.bias"):
        return _normal(shape, 0.01, g)
    if name in ("embed.weight",) or name.endswith(("engram.embed.weight", "markov_head.embed.weight")):
        return _normal(shape, 1.0, g)
    if len(shape) == 2:
        std = 1.0 / math.sqrt(shape[1])
        if name.endswith("_fn"):
            std *= 0.5  # mHC mixer logits stay in the sigmoid's linear range
        elif name.endswith(_RESIDUAL_WRITERS):
            std /= math.sqrt(cfg.num_hidden_layers)
        return _normal(shape, std, g)
    raise ValueError(f"no initialization rule for tensor {name!r} of shape {shape}")


def snap_to_precision(spec: TensorSpec, value: torch.Tensor, precision: str) -> torch.Tensor:
    """The float32 value a checkpoint written at `precision` gives back for `value`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32" or spec.kind == "fp32":
        return value
    if precision == "bf16" or spec.kind == "bf16":
        return value.to(torch.bfloat16).float()
    if spec.kind == "fp8":
        return formats.dequantize_fp8(*formats.quantize_fp8(value))
    if spec.kind == "fp8_rows":
        return formats.dequantize_fp8(*formats.quantize_fp8(value, row_block=1), row_block=1)
    if spec.kind == "fp4":
        return formats.dequantize_fp4(*formats.quantize_fp4(value))
    raise ValueError(f"{spec.name}: unknown storage kind {spec.kind!r}")


def random_weights(
    cfg: V41Config,
    seed: int,
    *,
    precision: str = "fp32",
    names: Iterable[str] | None = None,
    include_extras: bool = False,
) -> dict[str, torch.Tensor]:
    """float32 tensors keyed by released names, equal to what load_weights returns for a checkpoint
    written with the same seed and precision ("fp32": the raw draw). names: a subset (default: the
    backbone); include_extras adds Engram and DSpark tensors."""
    specs = checkpoint_tensor_specs(cfg) if include_extras else backbone_tensor_specs(cfg)
    if names is not None:
        wanted = set(names)
        unknown = wanted - {s.name for s in specs}
        if unknown:
            raise ValueError(f"not tensors of this config: {sorted(unknown)[:5]}")
        specs = [s for s in specs if s.name in wanted]
    return {s.name: snap_to_precision(s, random_tensor(s, cfg, seed), precision) for s in specs}
