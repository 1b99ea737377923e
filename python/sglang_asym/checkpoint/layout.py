"""Shard planning: which tensors go into which safetensors file.

Tensors are grouped by layer and the groups split into three runs of shards: the prefill role's
tensors (embeddings, the encoder layers with their Engram, the last KV source's KV path), the rest
of the backbone, and the DSpark draft. A role therefore opens only the shards of its own run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import V41Config
from ..layer_plan import LayerPlan
from ..tensor_specs import TensorSpec, backbone_tensor_specs, layer_of
from .specs import checkpoint_tensor_specs, released_nbytes

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def shard_file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


@dataclass(frozen=True)
class ShardPlan:
    files: tuple[str, ...]
    shards: tuple[tuple[TensorSpec, ...], ...]

    @property
    def sharded(self) -> bool:
        return len(self.files) > 1


def _layer_groups(specs: list[TensorSpec]) -> list[list[TensorSpec]]:
    """Consecutive runs of specs with the same layer (top-level tensors join their neighbours)."""
    groups: list[list[TensorSpec]] = []
    current_key: object = object()
    for spec in specs:
        key = layer_of(spec.name)
        if key is None and spec.name.startswith("mtp."):
            key = "mtp." + spec.name.split(".")[1]
        if groups and (key == current_key or key is None):
            groups[-1].append(spec)
        else:
            groups.append([spec])
            current_key = key
    return groups


def _split_by_bytes(groups: list[list[TensorSpec]], count: int) -> list[list[TensorSpec]]:
    """At most `count` contiguous runs of groups with about equal released bytes."""
    count = max(1, min(count, len(groups)))
    sizes = [sum(released_nbytes(s) for s in g) for g in groups]
    total = sum(sizes)
    runs: list[list[TensorSpec]] = [[]]
    done = 0
    for group, size in zip(groups, sizes):
        if runs[-1] and len(runs) < count and done >= total * len(runs) / count:
            runs.append([])
        runs[-1].extend(group)
        done += size
    return runs


def plan_shards(cfg: V41Config, num_shards: int, include_extras: bool = True) -> ShardPlan:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    specs = checkpoint_tensor_specs(cfg) if include_extras else backbone_tensor_specs(cfg)
    if num_shards == 1:
        return ShardPlan((SINGLE_FILE,), (tuple(specs),))
    plan = LayerPlan.from_config(cfg)
    last = plan.last_kv_source

    def prefill_side(spec: TensorSpec) -> bool:
        if spec.name in plan.prefill_tensor_names:
            return True
        layer = layer_of(spec.name)  # Engram tensors of encoder layers
        return layer is not None and layer < last

    draft = [s for s in specs if s.name.startswith("mtp.")]
    rest = [s for s in specs if not s.name.startswith("mtp.")]
    prefill = [s for s in rest if prefill_side(s)]
    decode = [s for s in rest if not prefill_side(s)]
    budget = num_shards - (1 if draft else 0)
    if budget < 2:
        raise ValueError(f"a sharded checkpoint needs at least {2 + bool(draft)} shards, got {num_shards}")
    runs = _split_by_bytes(_layer_groups(prefill), budget // 2)
    runs += _split_by_bytes(_layer_groups(decode), budget - budget // 2)
    if draft:
        runs.append(draft)
    files = tuple(shard_file_name(i, len(runs)) for i in range(len(runs)))
    return ShardPlan(files, tuple(tuple(r) for r in runs))
