"""Shared setup of the graph-runner tests: twin request caches (one driven by the reference model,
one by the runner) holding the same prefilled prompts, and step-by-step comparison."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from model.helpers import prompt
from sglang_asym.cache import CacheSizing, RequestCache
from sglang_asym.cache import GroupKind, parse_group, swa_group
from sglang_asym.model import V41Model
from sglang_asym.model.graph_runner import GraphRunner, RowKind, StepOutput, StepRows

SIZING = CacheSizing(max_requests=9, max_tokens=1024)


@dataclass
class Twins:
    model: V41Model
    ref: list[RequestCache]
    run: list[RequestCache]

    def release(self) -> None:
        for c in self.ref + self.run:
            c.release()


def twins(model: V41Model, prompt_lens: list[int], seed: int = 0, sizing: CacheSizing = SIZING) -> Twins:
    """Requests prefilled with the same prompts in two cache sets of `model`."""
    ref_set, run_set = model.new_cache_set(sizing), model.new_cache_set(sizing)
    ref, run = [], []
    for i, n in enumerate(prompt_lens):
        tokens = prompt(model.cfg, n, seed=seed + i)
        a, b = ref_set.new_request(), run_set.new_request()
        model(tokens, a, logits="none")
        model(tokens, b, logits="none")
        ref.append(a)
        run.append(b)
    return Twins(model, ref, run)


def step_both(t: Twins, runner: GraphRunner, tokens: list[torch.Tensor], kinds: list[RowKind],
              logits: list[str] | None = None, **run_kwargs) -> tuple[StepOutput, list[torch.Tensor | None]]:
    """One step: the runner over all requests at once, the reference model request by request."""
    logits = logits or ["all" if k is RowKind.DECODE else "last" for k in kinds]
    out = runner.run([StepRows(c, tok, k, lg) for c, tok, k, lg in zip(t.run, tokens, kinds, logits)],
                     **run_kwargs)
    ref = [t.model(tok, c, logits=lg) for c, tok, lg in zip(t.ref, tokens, logits)]
    return out, ref


def max_diff(got: list[torch.Tensor | None], want: list[torch.Tensor | None]) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape
            worst = max(worst, float((g.float().cpu() - w.float().cpu()).abs().max()))
    return worst


def same_argmax(got: list[torch.Tensor | None], want: list[torch.Tensor | None]) -> bool:
    return all(g is None or torch.equal(g.argmax(-1).cpu(), w.argmax(-1).cpu()) for g, w in zip(got, want))


def cache_state(cache: RequestCache) -> dict:
    """Everything a request's cache holds, comparable across cache sets: position, every group's
    stored row range and rows, window floors, compressor tails and the rollback journal."""
    groups = {name: (rows.start, rows.end, rows.read().clone()) for name, rows in cache.groups.items()}
    owners = {g.layer for g in map(parse_group, cache.groups) if g.kind is GroupKind.KV}
    tails = {o: cache.tail(o) for o in owners}
    return {"pos": cache.pos, "groups": groups, "floor": dict(cache.swa_floor), "tails": tails,
            "journal": dict(cache._journal)}


def assert_same_caches(got: RequestCache, want: RequestCache, tol: float = 0.0) -> None:
    a, b = cache_state(got), cache_state(want)
    assert (a["pos"], a["floor"]) == (b["pos"], b["floor"])
    assert a["groups"].keys() == b["groups"].keys()
    for name, (start, end, rows) in a["groups"].items():
        w_start, w_end, w_rows = b["groups"][name]
        assert (start, end) == (w_start, w_end), name
        assert rows.numel() == 0 or float((rows - w_rows).abs().max()) <= tol, name
    assert a["tails"].keys() == b["tails"].keys()
    for o, tail in a["tails"].items():
        assert (tail is None) == (b["tails"][o] is None), o
        if tail is not None:
            assert float((tail - b["tails"][o]).abs().max()) <= tol, o
    assert a["journal"].keys() == b["journal"].keys()
    for o, (first, values, gates) in a["journal"].items():
        w_first, w_values, w_gates = b["journal"][o]
        assert first == w_first and values.shape == w_values.shape, o
        assert float((values - w_values).abs().max()) <= tol and float((gates - w_gates).abs().max()) <= tol, o


def exhausted_window_pages(model: V41Model) -> tuple[Twins, Callable[[], None]]:
    """Requests prefilled with 70 and 64 tokens (64-row pages) whose next rows need a window page that
    layer 3's pool no longer has (all free pages held); the returned function gives them back."""
    t = twins(model, [70, 64], sizing=CacheSizing(max_requests=3, max_tokens=1024, page_rows=64))
    pool = t.run[1].set.pools[swa_group(3)]
    blocker = object()
    held = [pool.alloc(blocker) for _ in range(pool.free_pages)]

    def give_back() -> None:
        for page in held:
            pool.free(page, blocker)

    return t, give_back
