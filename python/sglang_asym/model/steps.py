"""Free functions over V41Model: full prefill, chunked prefill, decode steps, greedy generation."""

from __future__ import annotations

import torch

from ..cache import RequestCache
from .model import V41Model


def prefill(model: V41Model, cache: RequestCache, tokens: torch.Tensor, chunk: int | None = None,
            logits: str = "last") -> torch.Tensor | None:
    """Run the whole prompt, in one forward or in chunks of `chunk` tokens (any boundary)."""
    if chunk is None or chunk >= tokens.numel():
        return model(tokens, cache, logits=logits)
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    model.validate_tokens(tokens, cache.pos)
    outs = []
    for a in range(0, tokens.numel(), chunk):
        last_chunk = a + chunk >= tokens.numel()
        mode = logits if (logits == "all" or last_chunk) else "none"
        out = model(tokens[a : a + chunk], cache, logits=mode)
        if logits == "all":
            outs.append(out)
        elif last_chunk:
            return out
    return torch.cat(outs) if logits == "all" else None


def decode_step(model: V41Model, cache: RequestCache, tokens: torch.Tensor) -> torch.Tensor:
    """Append 1 (plain decode) or 1 + k (speculative verify) tokens; logits for each: [q_len, V]."""
    return model(tokens, cache, logits="all")


def greedy_continue(model: V41Model, cache: RequestCache, first_logits: torch.Tensor,
                    new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens starting from the logits of the last prompt position, and each step's logits."""
    tokens, step_logits = [], [first_logits]
    logits = first_logits
    for i in range(new_tokens):
        token = int(torch.argmax(logits))
        tokens.append(token)
        if i + 1 < new_tokens:
            logits = decode_step(model, cache, torch.tensor([token]))[-1]
            step_logits.append(logits)
    return tokens, step_logits
