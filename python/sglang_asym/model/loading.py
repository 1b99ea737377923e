"""Build a V41Model of a role from a checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import load_weights, read_checkpoint_config
from .model import ModelRole, V41Model


def model_from_checkpoint(directory: str | Path, role: ModelRole = "full", cache_quant: str = "none",
                          dtype: torch.dtype | str | None = None, device: str = "cpu",
                          progress: bool = False) -> V41Model:
    """The prefill role reads only its own tensors (and opens only the shards holding them)."""
    directory = Path(directory)
    cfg = read_checkpoint_config(directory)
    model = V41Model(cfg, role=role, cache_quant=cache_quant, dtype=dtype, device=device)
    weights = load_weights(directory, role="prefill" if role == "prefill" else "decode",
                           dtype=torch.float32, progress=progress)
    model.load_weights(weights)
    return model
