"""The exact full-prompt prefill on the full model: [0, N) through every layer in chunks, then the
first token sampled with the request's sampling parameters. Symmetric PD's prefill worker runs it
(shipping rows between chunks), and so do a colocated `exact` server and a symmetric decode worker's
health probes, with the same chunking, so all of them compute the same numbers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ...cache import CacheSet, RequestCache
from ...model import V41Model
from ...split import SplitPlan
from ..engine_api import SamplingParams
from .request_state import extract_state, state_manifest
from .sampler import make_generator, sample


@dataclass(frozen=True)
class FirstToken:
    token: int
    generator: torch.Generator | None  # None for greedy requests (nothing random to continue)
    compute_s: float  # forward passes and the draw


def prefill_prompt(model: V41Model, cache: RequestCache, prompt: torch.Tensor, chunk: int,
                   after_chunk: Callable[[RequestCache], bool] | None = None) -> torch.Tensor | None:
    """Run [0, N) in chunks of `chunk` tokens; the last position's logits. `after_chunk(cache)` runs
    after every chunk but the last; returning False stops early (None is returned)."""
    if model.role != "full":
        raise ValueError("the full-prompt prefill needs the full model")
    n = prompt.numel()
    for start in range(0, n, chunk):
        last = start + chunk >= n
        logits = model(prompt[start : start + chunk], cache, logits="last" if last else "none")
        if last:
            return logits
        if after_chunk is not None and not after_chunk(cache):
            return None
    raise ValueError("empty prompt")


def sample_first(logits: torch.Tensor, sampling: SamplingParams, fallback_seed: int
                 ) -> tuple[int, torch.Generator | None]:
    """The first token, and for non-greedy sampling the generator advanced past its draw."""
    generator = None if sampling.is_greedy else make_generator(sampling, fallback_seed)
    return sample(logits, sampling, generator), generator


@dataclass(frozen=True)
class LocalState:
    """A full prompt's state computed in this process: its first token and every cache row."""

    first: FirstToken
    rows: dict[str, torch.Tensor]


def prefill_locally(model: V41Model, cache_set: CacheSet, prompt: torch.Tensor, split: SplitPlan, chunk: int,
                    sampling: SamplingParams, fallback_seed: int) -> LocalState:
    """Full prompt on a scratch cache, first token, then the rows copied out and the cache freed."""
    cache = cache_set.new_request()
    try:
        t0 = time.perf_counter()
        logits = prefill_prompt(model, cache, prompt, chunk)
        token, generator = sample_first(logits, sampling, fallback_seed)
        first = FirstToken(token, generator, time.perf_counter() - t0)
        manifest = state_manifest(split, "model", model.dtype, sampled=generator is not None)
        return LocalState(first, extract_state(cache, manifest))
    finally:
        cache.release()
