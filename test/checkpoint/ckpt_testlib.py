"""Helpers for the checkpoint tests: copy a checkpoint, edit its index or one shard."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

SEED = 1234


def copy_checkpoint(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def index_of(directory: Path) -> dict:
    return json.loads((directory / "model.safetensors.index.json").read_text())


def write_index(directory: Path, index: dict) -> None:
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def rewrite_shard(directory: Path, file_name: str, edit) -> None:
    """Load one shard, let edit(dict) change it in place, write it back."""
    path = directory / file_name
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def shard_keys(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())
