"""The greedy tokens an asym-prefill / asym-decode pair computes, by the in-process reference model.

P runs [0, B) in SGLang's prefill chunks and D runs the window [B, N) in its window chunks with the
semantics' floors, each cut where the reference forward cuts it (reference_forward.pieces); then greedy
decoding one token at a time. The reference model is not chunk-invariant bit for bit, so the pieces must
be the pair's: this is what the demo and benchmarks compare SGLang's servers with.
"""

from __future__ import annotations

import torch

from sglang_asym.model.model import V41Model
from sglang_asym.sched.config import DEFAULT_WINDOW_CHUNK
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import RequestRows, pieces
from sglang_asym.split import Semantics


def pair_spans(n: int, window: int, prefill_chunk: int) -> list[tuple[int, int]]:
    """The forwards of one request through the pair: P's chunks of [0, B), then D's window [B, N)."""
    if n < 1 or window < 1 or prefill_chunk < 1:
        raise ValueError(f"n, window and prefill_chunk must be >= 1, got {n}, {window}, {prefill_chunk}")
    boundary = max(n - window, 0)
    return [(s, min(s + prefill_chunk, boundary)) for s in range(0, boundary, prefill_chunk)] + [(boundary, n)]


def pair_greedy(model: V41Model, prompt: list[int], prefill_chunk: int, semantics: str, count: int,
                window_chunk: int = DEFAULT_WINDOW_CHUNK) -> list[int]:
    """`count` greedy tokens of `prompt` as the pair with the model's window computes them (see module doc)."""
    cfg, n = model.cfg, len(prompt)
    tokens = torch.tensor(prompt)
    cache = model.new_cache_set().new_request()
    try:
        logits = None
        for start, end in pair_spans(n, cfg.sliding_window, prefill_chunk):
            rows = RequestRows(0, start, tokens[start:end], n)
            for piece, floors in pieces(rows, cfg, cfg.sliding_window, Semantics(semantics), window_chunk):
                cache.swa_floor.update(floors)
                logits = model(piece.tokens, cache, logits="last")
        out = [int(logits.argmax())]
        while len(out) < count:
            out.append(int(model(torch.tensor([out[-1]]), cache, logits="last").argmax()))
        return out
    finally:
        cache.release()
