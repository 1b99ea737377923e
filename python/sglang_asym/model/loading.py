"""Build a V41Model of a role from a checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..checkpoint import load_weights, read_checkpoint_config
from ..tensor_specs import layer_of
from .model import ModelRole, V41Model


def model_from_checkpoint(directory: str | Path, role: ModelRole = "full", cache_quant: str = "none",
                          dtype: torch.dtype | str | None = None, device: str = "cpu",
                          progress: bool = False) -> V41Model:
    """The prefill role reads only its own tensors (and opens only the shards holding them)."""
    directory = Path(directory)
    cfg = read_checkpoint_config(directory)
    model = V41Model(cfg, role=role, cache_quant=cache_quant, dtype=dtype, device=device)
    # Load layer by layer so that at most one layer's float copy exists beside the model's parameters.
    by_part: dict[int | None, list[str]] = {}
    for name in sorted(model.expected_tensor_names()):
        by_part.setdefault(layer_of(name), []).append(name)
    for part, names in by_part.items():
        model.load_weights(load_weights(directory, names, dtype=torch.float32, progress=False), strict=False)
        if progress:
            print(f"\rloaded {'top-level tensors' if part is None else f'layer {part}'}", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return model
