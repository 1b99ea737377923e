"""Parameter and byte counts of a checkpoint by part (embeddings, encoder, ...) at released precision.

Storage: (fp8: 1 B + one e8m0 byte per 32x32 block; fp4: 0.5 B + one e8m0 byte per row and 32 columns;
fp8_rows: 1 B + one byte per row and 32 columns; bf16: 2 B; fp32: 4 B). Specs only: nothing is
allocated, so the Flash config is accounted exactly without a device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..config import V41Config
from ..layer_plan import LayerPlan
from ..tensor_specs import TensorSpec, layer_of
from .specs import checkpoint_tensor_specs, released_nbytes

# In model order. The prefill role holds the first three of the backbone parts.
BACKBONE_PARTS = (
    "embeddings",
    "encoder_layers",
    "kv_source_kv_path",
    "kv_source_rest",
    "decoder_layers",
    "final_norm_and_head",
)
PREFILL_BACKBONE_PARTS = ("embeddings", "encoder_layers", "kv_source_kv_path")
EXTRA_PARTS = ("engram", "dspark")
PARTS = BACKBONE_PARTS + EXTRA_PARTS


@dataclass(frozen=True)
class Tally:
    tensors: int = 0
    params: int = 0
    bytes: int = 0

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(self.tensors + other.tensors, self.params + other.params, self.bytes + other.bytes)

    @classmethod
    def of(cls, specs: Iterable[TensorSpec]) -> "Tally":
        total = cls()
        for s in specs:
            total = total + cls(1, s.numel, released_nbytes(s))
        return total

    def as_dict(self) -> dict[str, int]:
        return {"tensors": self.tensors, "params": self.params, "bytes": self.bytes}


def part_of(name: str, plan: LayerPlan) -> str:
    if name.startswith("mtp."):
        return "dspark"
    if ".engram." in name:
        return "engram"
    if name == "embed.weight":
        return "embeddings"
    if name in ("norm.weight", "head.weight"):
        return "final_norm_and_head"
    layer = layer_of(name)
    if layer is None:
        raise ValueError(f"tensor {name!r} belongs to no footprint part")
    last = plan.last_kv_source
    if layer < last:
        return "encoder_layers"
    if layer > last:
        return "decoder_layers"
    return "kv_source_kv_path" if name in plan.prefill_tensor_names else "kv_source_rest"


def partition(cfg: V41Config) -> dict[str, list[TensorSpec]]:
    plan = LayerPlan.from_config(cfg)
    parts: dict[str, list[TensorSpec]] = {p: [] for p in PARTS}
    for spec in checkpoint_tensor_specs(cfg):
        parts[part_of(spec.name, plan)].append(spec)
    return parts


def part_tallies(cfg: V41Config) -> dict[str, Tally]:
    return {name: Tally.of(specs) for name, specs in partition(cfg).items()}
