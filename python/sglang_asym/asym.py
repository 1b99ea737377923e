"""The asymmetric split's two halves and the single-process reference they must reproduce.

  run_prefix     prefill role: tokens [0, B) on the partial model -> PrefixState (only the manifest's rows)
  run_window     decode role: install a PrefixState, run [B, N) through every layer -> last logits + cache
  run_reference  one full model, one process: [0, B) exact, then [B, N) with the semantics' floors
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cache import CacheSet, GroupKind, RequestCache, index_group, kv_group, parse_group, swa_group, tail_group
from .cache.groups import row_count
from .model import V41Model
from .model.steps import prefill
from .split import Semantics, SplitPlan


class PrefixMismatch(ValueError):
    """A PrefixState that does not belong to this model / window / prompt."""


@dataclass(frozen=True)
class PrefixState:
    """Everything the decode role needs from the prefill role, keyed by cache group name."""

    config_fingerprint: str
    window: int
    semantics: str
    prompt_len: int
    boundary: int
    rows: dict[str, torch.Tensor] = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.rows.values())


def run_prefix(model: V41Model, cache_set: CacheSet, tokens: torch.Tensor, split: SplitPlan,
               chunk: int | None = None) -> PrefixState:
    """Prefill role: compute [0, B) and extract exactly the manifest's rows; the cache is released."""
    if model.role != "prefill":
        raise ValueError("run_prefix needs the prefill-role model")
    _check_prompt(tokens, split)
    split.require_splittable()
    model.layers_run = ()
    meta = dict(config_fingerprint=model.cfg.fingerprint(), window=split.window,
                semantics=split.semantics.value, prompt_len=split.prompt_len, boundary=split.boundary)
    if not split.runs_prefill:
        return PrefixState(**meta)
    cache = cache_set.new_request()
    try:
        prefill(model, cache, tokens[: split.boundary], chunk=chunk, logits="none")
        rows = extract_payload(cache, split)
    finally:
        cache.release()
    return PrefixState(**meta, rows=rows)


def extract_payload(cache: RequestCache, split: SplitPlan) -> dict[str, torch.Tensor]:
    """Copy the manifest's rows out of a prefill-role cache."""
    rows: dict[str, torch.Tensor] = {}
    swa_start, swa_end = split.encoder_swa_rows
    for group in split.manifest(row_format="model").groups:
        gid = parse_group(group.name)
        if gid.kind is GroupKind.TAIL:
            rows[group.name] = cache.tail(gid.layer).clone()
        elif gid.kind is GroupKind.SWA:
            rows[group.name] = cache.rows(group.name).read(swa_start, swa_end).clone()
        else:
            rows[group.name] = cache.rows(group.name).read(0, group.num_rows).clone()
    return rows


def install_prefix(model: V41Model, cache_set: CacheSet, state: PrefixState, split: SplitPlan) -> RequestCache:
    """Decode role: a fresh request cache holding the prefix rows, floors set, positioned at B."""
    split.require_splittable()
    _check_state(model, state, split)
    cache = cache_set.new_request()
    try:
        swa_start, _ = split.encoder_swa_rows
        for layer in range(model.cfg.num_hidden_layers):
            shipped = swa_group(layer) in state.rows
            cache.start_swa_at(layer, swa_start if shipped else split.boundary)
            if shipped:
                cache.rows(swa_group(layer)).append(state.rows[swa_group(layer)].to(model.dtype))
        for owner in model.plan.kv_owner_layers:
            for group in (kv_group(owner), index_group(owner)):
                if group in state.rows:
                    cache.rows(group).append(state.rows[group].to(model.dtype))
            if tail_group(owner) in state.rows:
                cache.set_tail(owner, state.rows[tail_group(owner)])
        cache.swa_floor.update(split.swa_floors())
        cache.pos = split.boundary
    except Exception:
        cache.release()
        raise
    return cache


def run_window(model: V41Model, cache_set: CacheSet, state: PrefixState, tokens: torch.Tensor,
               split: SplitPlan, logits: str = "last",
               capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, RequestCache]:
    """Decode role's first step: [B, N) over the transferred prefix. The caller owns the cache.
    `capture`: layer ids whose input features are left in `model.captured` (the drafter's context)."""
    if model.role != "full":
        raise ValueError("run_window needs the full model")
    _check_prompt(tokens, split)
    cache = install_prefix(model, cache_set, state, split)
    try:
        out = model(tokens[split.boundary :], cache, logits=logits, capture=capture)
    except Exception:
        cache.release()
        raise
    return out, cache


def run_reference(model: V41Model, cache_set: CacheSet, tokens: torch.Tensor, split: SplitPlan,
                  logits: str = "last") -> tuple[torch.Tensor, RequestCache]:
    """Single process, full model: the semantics' result with no transfer in between."""
    _check_prompt(tokens, split)
    cache = cache_set.new_request()
    try:
        if split.semantics is Semantics.EXACT or not split.runs_prefill:
            if logits == "window":
                full = model(tokens, cache, logits="all")
                return full[split.boundary :], cache
            return model(tokens, cache, logits=logits), cache
        model(tokens[: split.boundary], cache, logits="none")
        cache.swa_floor.update(split.swa_floors())
        out = model(tokens[split.boundary :], cache, logits="all" if logits == "window" else logits)
        return out, cache
    except Exception:
        cache.release()
        raise


def _check_prompt(tokens: torch.Tensor, split: SplitPlan) -> None:
    if tokens.ndim != 1 or tokens.numel() != split.prompt_len:
        raise ValueError(f"prompt has {tokens.numel()} tokens but the split plan is for N={split.prompt_len}")


def _check_state(model: V41Model, state: PrefixState, split: SplitPlan) -> None:
    if state.config_fingerprint != model.cfg.fingerprint():
        raise PrefixMismatch("PrefixState comes from a model with another config "
                             f"({state.config_fingerprint} != {model.cfg.fingerprint()})")
    if state.window != split.window:
        raise PrefixMismatch(f"PrefixState was cut with window W={state.window}, this split uses W={split.window}")
    if state.prompt_len != split.prompt_len or state.boundary != split.boundary:
        raise PrefixMismatch(f"PrefixState is for N={state.prompt_len} (B={state.boundary}), "
                             f"this request has N={split.prompt_len} (B={split.boundary})")
    expected = {g.name: g.num_rows for g in split.manifest(row_format="model").groups}
    got = {name: row_count(name, t) for name, t in state.rows.items()}
    if expected != got:
        raise PrefixMismatch(f"PrefixState rows {got} do not match the split manifest {expected}")
