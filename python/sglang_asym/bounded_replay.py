"""Symmetric serving with bounded replay: SGLang's default for V4.1 on a GPU, in one process on the full model.

A prompt of N tokens and window W (B = max(N - W, 0)) runs in two passes of one model:
  [0, B)  the layers before the last KV source, then that layer's compressed rows and index keys only
  [B, N)  every layer; from the last KV source on, window keys start at B (decoder-replay floors)
So the layers before the last KV source compute all N rows, the last KV source writes compressed rows for
all N, and the layers from it on compute only the last W rows. The semantics is decoder-replay: the same
tokens as the asymmetric split with the exact-encoder handoff, which computes [0, B) on another process.
"""

from __future__ import annotations

import torch

from .cache import CacheSet, RequestCache
from .config import DEFAULT_WINDOW
from .model import V41Model
from .split import Semantics, SplitPlan


def bounded_replay_split(model: V41Model, prompt_len: int, window: int = DEFAULT_WINDOW) -> SplitPlan:
    """The cut bounded replay makes (its semantics is decoder-replay)."""
    return SplitPlan(model.cfg, prompt_len, window, Semantics.DECODER_REPLAY)


def run_bounded_replay(model: V41Model, cache_set: CacheSet, tokens: torch.Tensor, window: int = DEFAULT_WINDOW,
                       logits: str = "last") -> tuple[torch.Tensor, RequestCache]:
    """Prefill one prompt with bounded replay; returns the logits asked for (of [B, N) with 'all') and the
    request's cache, positioned at N and ready for decode steps. The caller owns the cache."""
    if model.role != "full":
        raise ValueError("bounded replay runs on the full model")
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    split = bounded_replay_split(model, tokens.numel(), window)
    cache = cache_set.new_request()
    try:
        if split.runs_prefill:
            model.forward_to_kv_source(tokens[: split.boundary], cache)
            cache.swa_floor.update(split.swa_floors())
        out = model(tokens[split.boundary :], cache, logits=logits)
    except Exception:
        cache.release()
        raise
    return out, cache
