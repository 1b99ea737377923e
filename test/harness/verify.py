"""Run the split (prefill-role model -> payload -> decode-role model) and the single-process reference of
the same semantics on a random prompt; `verify` returns what both produced as one dict.

The prefill role is a separate model instance holding only its tensors; only the payload
manifest's rows pass from it to the decode role."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sglang_asym.asym import run_prefix, run_reference, run_window
from sglang_asym.checkpoint.random_init import random_weights
from sglang_asym.config import V41Config
from sglang_asym.model import V41Model
from sglang_asym.model.steps import greedy_continue
from sglang_asym.split import Semantics, SplitPlan


@dataclass
class Models:
    """The prefill-role instance and the full (decode-role) instance of one random checkpoint."""

    prefill: V41Model
    full: V41Model

    @classmethod
    def build(cls, cfg: V41Config, seed: int, cache_quant: str = "none", dtype: str | None = None) -> "Models":
        weights = random_weights(cfg, seed)
        full = V41Model(cfg, cache_quant=cache_quant, dtype=dtype)
        full.load_weights(weights)
        prefill_model = V41Model(cfg, role="prefill", cache_quant=cache_quant, dtype=dtype)
        prefill_model.load_weights({k: v for k, v in weights.items() if k in prefill_model.expected_tensor_names()})
        return cls(prefill_model, full)


def random_prompt(cfg: V41Config, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed * 7919 + n))


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) in nats for one position's logits."""
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return float((lp.exp() * (lp - lq)).sum())


def verify(models: Models, prompt: torch.Tensor, window: int, semantics: str, new_tokens: int,
           with_exact: bool = True) -> dict:
    cfg = models.full.cfg
    split = SplitPlan(cfg, prompt.numel(), window, semantics)
    p_caches, d_caches = models.prefill.new_cache_set(), models.full.new_cache_set()
    t0 = time.perf_counter()
    state = run_prefix(models.prefill, p_caches, prompt, split)
    t1 = time.perf_counter()
    first, cache = run_window(models.full, d_caches, state, prompt, split)
    split_tokens, split_logits = greedy_continue(models.full, cache, first, new_tokens)
    cache.release()
    t2 = time.perf_counter()
    ref_first, ref_cache = run_reference(models.full, d_caches, prompt, split)
    ref_tokens, ref_logits = greedy_continue(models.full, ref_cache, ref_first, new_tokens)
    ref_cache.release()
    exact_kl = None
    if with_exact:
        exact_split = SplitPlan(cfg, prompt.numel(), window, Semantics.EXACT)
        exact_first, exact_cache = run_reference(models.full, d_caches, prompt, exact_split)
        exact_cache.release()
        exact_kl = kl(exact_first, ref_first)
    p_caches.check_no_leak()
    d_caches.check_no_leak()
    same = 0
    while same < min(len(split_tokens), len(ref_tokens)) and split_tokens[same] == ref_tokens[same]:
        same += 1
    compared = range(min(same + 1, len(split_logits), len(ref_logits)))
    diff = max((float((split_logits[i] - ref_logits[i]).abs().max()) for i in compared), default=0.0)
    return {
        "config_layers": cfg.num_hidden_layers,
        "prompt_len": prompt.numel(),
        "window": window,
        "boundary": split.boundary,
        "semantics": split.semantics.value,
        "split_tokens": split_tokens,
        "reference_tokens": ref_tokens,
        "tokens_equal": split_tokens == ref_tokens,
        "max_abs_logit_diff": diff,
        "kl_vs_exact": exact_kl,
        "payload_bytes": state.nbytes(),
        "payload_bytes_release_formats": split.manifest("release").total_bytes,
        "payload_groups": {g.name: g.num_rows for g in split.manifest("model").groups},
        "prefill_layers_run": list(models.prefill.layers_run),
        "prefill_seconds": round(t1 - t0, 3),
        "decode_seconds": round(t2 - t1, 3),
    }

