"""Per-request cache groups over shared paged pools.

Groups (docs/v41-model.md, "Cache groups"; their names and identities: cache/groups.py):
  swa.L{i}    layer i's window KV rows (one per token; only the last window is kept)
  kv.L{o}     owner o's compressed main-KV rows (one per token pair for ratio 2, per token for ratio 1)
  index.L{o}  owner o's index-key rows (same count as kv.L{o})
  tail.L{o}   ratio-2 owner o's pending unpaired token: its compressor value and gate, fp32 [2, head_dim]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import V41Config
from ..layer_plan import LayerPlan
from .groups import GroupKind, index_group, kv_group, parse_group, swa_group, tail_group
from .paged import PagedPool, PagedRows, PoolSpec


# Compressor inputs kept per ratio-2 owner for rollback: more than the widest verify step (1 + 7).
JOURNAL_TOKENS = 16
# Window rows kept past the window so a rejected speculative suffix can be undone (see model.attention).
ROLLBACK_MARGIN_ROWS = 16


@dataclass(frozen=True)
class CacheSizing:
    max_requests: int = 4
    max_tokens: int = 8192  # per request, prompt + generated
    page_rows: int = 64
    # Longest single forward: window rows live only for the last window plus one forward's rows.
    # None means a whole request may run in one forward (the reference model's one-shot prefill).
    max_chunk_tokens: int | None = None


class CacheSet:
    """The pools of one model instance. `role='prefill'` has no pools for layers past the last KV source."""

    def __init__(self, cfg: V41Config, dtype: torch.dtype, sizing: CacheSizing = CacheSizing(),
                 role: str = "full", device: torch.device | str = "cpu") -> None:
        self.cfg, self.sizing, self.dtype, self.role = cfg, sizing, dtype, role
        self.plan = LayerPlan.from_config(cfg)
        pr = sizing.page_rows

        def pages(rows_per_request: int) -> int:
            return sizing.max_requests * (-(-rows_per_request // pr) + 1)

        self.pools: dict[str, PagedPool] = {}
        chunk = sizing.max_tokens if sizing.max_chunk_tokens is None else min(sizing.max_chunk_tokens, sizing.max_tokens)
        swa_rows = chunk + cfg.sliding_window + ROLLBACK_MARGIN_ROWS + pr
        swa_layers = self.plan.encoder_layers if role == "prefill" else range(cfg.num_hidden_layers)
        for i in swa_layers:
            self._add(PoolSpec(swa_group(i), (cfg.head_dim,), dtype, pr, pages(swa_rows)), device)
        for o in self.plan.kv_owner_layers:
            rows = sizing.max_tokens // cfg.compress_ratios[o] + 1
            self._add(PoolSpec(kv_group(o), (cfg.head_dim,), dtype, pr, pages(rows)), device)
            self._add(PoolSpec(index_group(o), (cfg.index_head_dim,), dtype, pr, pages(rows)), device)
            if cfg.compress_ratios[o] > 1:
                self._add(PoolSpec(tail_group(o), (2, cfg.head_dim), torch.float32, 1, sizing.max_requests), device)

    def _add(self, spec: PoolSpec, device) -> None:
        self.pools[spec.name] = PagedPool(spec, device)

    def new_request(self) -> "RequestCache":
        return RequestCache(self)

    def free_pages(self) -> dict[str, int]:
        return {name: pool.free_pages for name, pool in self.pools.items()}

    def check_no_leak(self, expect_all_free: bool = True) -> None:
        for pool in self.pools.values():
            pool.check_no_leak()
            if expect_all_free and pool.used_pages:
                raise AssertionError(f"pool {pool.spec.name!r} still holds {pool.used_pages} pages")


class RequestCache:
    """One request's rows in every group, the number of tokens processed, and per-layer SWA floors."""

    def __init__(self, cache_set: CacheSet) -> None:
        self.set = cache_set
        self.pos = 0
        self.groups: dict[str, PagedRows] = {}
        self.swa_floor: dict[int, int] = {}
        self._tails: dict[int, PagedRows] = {}
        self._journal: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.released = False

    def rows(self, group: str) -> PagedRows:
        rows = self.groups.get(group)
        if rows is None:
            if group not in self.set.pools:
                raise KeyError(f"this model's cache has no group {group!r}")
            rows = self.groups[group] = PagedRows(self.set.pools[group], self)
        return rows

    def start_swa_at(self, layer: int, start: int) -> None:
        """Begin layer's window rows at `start` (rows below it are never stored)."""
        group = swa_group(layer)
        if group in self.groups and len(self.groups[group]):
            raise RuntimeError(f"{group} already holds rows")
        self.groups[group] = PagedRows(self.set.pools[group], self, start)

    # ---- compressor tails (ratio-2 owners) -----------------------------------------------
    def tail(self, owner: int) -> torch.Tensor | None:
        rows = self._tails.get(owner)
        return None if rows is None or not len(rows) else rows.read()[0]

    def set_tail(self, owner: int, value: torch.Tensor | None) -> None:
        old = self._tails.pop(owner, None)
        if old is not None:
            old.release()
        if value is not None:
            rows = PagedRows(self.set.pools[tail_group(owner)], self)
            rows.append(value.unsqueeze(0).float())
            self._tails[owner] = rows

    # ---- speculative rollback ------------------------------------------------------------
    def record_pair_inputs(self, owner: int, first_pos: int, values: torch.Tensor, gates: torch.Tensor) -> None:
        """Keep the last JOURNAL_TOKENS tokens' compressor value/gate so a rollback can rebuild a tail."""
        keep = min(JOURNAL_TOKENS, values.shape[0])
        self._journal[owner] = (first_pos + values.shape[0] - keep, values[-keep:].clone(), gates[-keep:].clone())

    def pair_input(self, owner: int, token: int) -> torch.Tensor:
        """Layer owner's journaled compressor (value, gate) of `token`, as a tail holds it: [2, head_dim]."""
        if owner not in self._journal:
            raise ValueError(f"layer {owner} has no journaled compressor inputs")
        first, values, gates = self._journal[owner]
        if not first <= token < first + values.shape[0]:
            raise ValueError(f"layer {owner}'s compressor input for token {token} is no longer kept "
                             f"(journal holds [{first}, {first + values.shape[0]}))")
        return torch.stack((values[token - first], gates[token - first]))

    def truncate(self, pos: int) -> None:
        """Roll back to `pos` tokens (drop a rejected speculative suffix): window rows, compressed rows
        and index keys past it are forgotten and each ratio-2 owner's tail is rebuilt."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"cannot roll back to {pos}: the request holds {self.pos} tokens")
        if pos == self.pos:
            return
        cfg = self.set.cfg
        for name, rows in self.groups.items():
            group = parse_group(name)
            ratio = 1 if group.kind is GroupKind.SWA else cfg.compress_ratios[group.layer]
            rows.truncate(max(min(pos // ratio, rows.end), rows.start))
        for owner in self._journal:
            if pos % 2 == 0:
                self.set_tail(owner, None)
                continue
            try:
                tail = self.pair_input(owner, pos - 1)
            except ValueError as exc:
                raise ValueError(f"cannot roll back to {pos}: {exc}") from None
            self.set_tail(owner, tail)
        self.pos = pos

    def release(self) -> None:
        """Return every page to its pool; safe to call twice."""
        for rows in list(self.groups.values()) + list(self._tails.values()):
            rows.release()
        self.groups.clear()
        self._tails.clear()
        self._journal.clear()
        self.released = True
