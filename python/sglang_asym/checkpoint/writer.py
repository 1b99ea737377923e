"""write_checkpoint(): a checkpoint in the released layout at a chosen precision (random or given weights).

config.json, safetensors shards (+ model.safetensors.index.json when sharded). At release precision
config.json carries the release's quantization_config (see quantization.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from ..config import V41Config
from ..tensor_specs import TensorSpec
from . import formats
from .layout import INDEX_FILE, plan_shards
from .quantization import config_for_precision
from .random_init import random_tensor
from .specs import disk_layout, scale_name
from .threads import single_threaded


def encode_for_disk(spec: TensorSpec, value: torch.Tensor, precision: str) -> dict[str, torch.Tensor]:
    """The stored tensor(s) of one float value: the weight, and its `.scale` when quantized."""
    layout = disk_layout(spec, precision)
    if tuple(value.shape) != spec.shape:
        raise ValueError(f"{spec.name}: value shape {tuple(value.shape)} != spec shape {spec.shape}")
    if len(layout) == 1:
        return {spec.name: value.to(layout[0].dtype).contiguous()}
    if spec.kind == "fp4":
        q, s = formats.quantize_fp4(value)
    else:
        q, s = formats.quantize_fp8(value, row_block=1 if spec.kind == "fp8_rows" else formats.BLOCK)
    return {spec.name: q.contiguous(), scale_name(spec.name): s.contiguous()}


@dataclass(frozen=True)
class WriteSummary:
    directory: Path
    files: tuple[str, ...]
    tensors: int  # stored tensors, scales included
    total_bytes: int


def write_checkpoint(
    out_dir: str | Path,
    cfg: V41Config,
    seed: int,
    *,
    precision: str = "release",
    num_shards: int = 1,
    include_extras: bool = True,
    progress: bool = True,
    values: Mapping[str, torch.Tensor] | None = None,
) -> WriteSummary:
    """Random weights (random_init.random_tensor) for every checkpoint tensor of cfg, DSpark and
    Engram included unless include_extras is False; one shard is written and freed at a time.
    `values`: float tensors by released name (e.g. trained weights) used instead of the random draw."""
    values = {} if values is None else values
    disk_cfg = config_for_precision(cfg, precision)  # checks precision before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    disk_cfg.write_json(out / "config.json")
    plan = plan_shards(cfg, num_shards, include_extras)
    unknown = set(values) - {spec.name for shard in plan.shards for spec in shard}
    if unknown:
        raise ValueError(f"values hold tensors this checkpoint does not have: {sorted(unknown)[:5]}")
    weight_map: dict[str, str] = {}
    total_bytes = 0
    bar = tqdm(total=sum(len(s) for s in plan.shards), desc=f"writing {out.name}", unit="tensor",
               file=sys.stderr, disable=not progress)
    with bar, single_threaded():
        for file_name, shard in zip(plan.files, plan.shards):
            stored: dict[str, torch.Tensor] = {}
            for spec in shard:
                value = values[spec.name] if spec.name in values else random_tensor(spec, cfg, seed)
                stored.update(encode_for_disk(spec, value.detach().float(), precision))
                bar.update(1)
            save_file(stored, str(out / file_name), metadata={"format": "pt"})
            total_bytes += sum(t.numel() * t.element_size() for t in stored.values())
            weight_map.update(dict.fromkeys(stored, file_name))
            del stored
    if plan.sharded:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return WriteSummary(out, plan.files, len(weight_map), total_bytes)
