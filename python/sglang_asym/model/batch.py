"""The batch types of a forward: each request's rows (Segment) with its cache and per-forward state.

Shared by the model's blocks, attention, compressors and the decode-step runner; kept apart from
attention.py so that no two modules of the model import each other."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import RequestCache
from ..config import V41Config


def window_start(cfg: V41Config, layer: int, first: int, floor: int, window_rows) -> int:
    """The first window key a chunk starting at position `first` reads (its window reaches back
    sliding_window - 1 positions, never below the layer's floor); raises if the cache dropped it."""
    need = max(floor, first - cfg.sliding_window + 1, 0)
    if window_rows.start > need:
        raise RuntimeError(f"layer {layer}: window rows from {need} are needed but the cache starts at "
                           f"{window_rows.start} (no floor covers them)")
    return need


@dataclass
class ChunkState:
    """Per-request, per-forward state that flows from layer to layer (never cached across forwards)."""

    positions: torch.Tensor  # [T] absolute positions of the chunk's tokens
    selection: torch.Tensor | None = None  # [T, k] row ids chosen by the latest index source (-1: none)
    candidates: torch.Tensor | None = None  # [T, rows] candidate mask from the last KV source


@dataclass
class Segment:
    """One request's consecutive rows inside a batched forward, with its cache and chunk state."""

    rows: slice
    cache: RequestCache
    state: ChunkState

    @property
    def start(self) -> int:
        return int(self.state.positions[0])


@dataclass
class RowBatch:
    """The rows of one forward: dense parts run over all of them, attention per segment on its own cache."""

    positions: torch.Tensor  # [rows] every segment's positions, concatenated in segment order
    segments: list[Segment]
