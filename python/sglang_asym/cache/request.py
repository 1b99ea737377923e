"""Per-request cache groups of one model instance, and the rollback of a rejected speculative suffix.

Groups (docs/v41-model.md, "Cache groups"; their names and identities: cache/groups.py):
  swa.L{i}    layer i's window KV rows (one per token; only the last window is kept)
  kv.L{o}     owner o's compressed main-KV rows (one per token pair for ratio 2, per token for ratio 1)
  index.L{o}  owner o's index-key rows (same count as kv.L{o})
  tail.L{o}   ratio-2 owner o's pending unpaired token: its compressor value and gate, fp32 [2, head_dim]
"""

from __future__ import annotations

import torch

from ..config import V41Config
from ..layer_plan import LayerPlan
from .groups import GroupKind, index_group, kv_group, parse_group, swa_group
from .rows import GroupRows


# Compressor inputs kept per ratio-2 owner for rollback: more than the widest verify step (1 + 7).
JOURNAL_TOKENS = 16
# Window rows kept past the window so a rejected speculative suffix can be undone (see model.attention).
ROLLBACK_MARGIN_ROWS = 16


class CacheSet:
    """The cache groups of one model instance and the requests holding rows in them. `role='prefill'` has no
    groups for layers past the last KV source."""

    def __init__(self, cfg: V41Config, plan: LayerPlan, dtype: torch.dtype, role: str = "full",
                 device: torch.device | str = "cpu") -> None:
        self.cfg, self.dtype, self.role = cfg, dtype, role
        swa_layers = plan.encoder_layers if role == "prefill" else range(cfg.num_hidden_layers)
        widths = {swa_group(i): cfg.head_dim for i in swa_layers}
        for o in plan.kv_owner_layers:
            widths.update({kv_group(o): cfg.head_dim, index_group(o): cfg.index_head_dim})
        # each group's rows start from an empty [0, width] tensor of its dtype and device
        self.empty_rows = {name: torch.empty((0, width), dtype=dtype, device=device) for name, width in widths.items()}
        self.live: set[RequestCache] = set()

    def new_request(self) -> "RequestCache":
        cache = RequestCache(self)
        self.live.add(cache)
        return cache

    def check_no_leak(self) -> None:
        if self.live:
            raise AssertionError(f"{len(self.live)} request cache(s) not released")


class RequestCache:
    """One request's rows in every group, the number of tokens processed, and per-layer SWA floors."""

    def __init__(self, cache_set: CacheSet) -> None:
        self.set = cache_set
        self.pos = 0
        self.groups: dict[str, GroupRows] = {}
        self.swa_floor: dict[int, int] = {}
        self._tails: dict[int, torch.Tensor] = {}
        self._journal: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}
        self.released = False

    def rows(self, group: str, start: int = 0) -> GroupRows:
        rows = self.groups.get(group)
        if rows is None:
            if group not in self.set.empty_rows:
                raise KeyError(f"this model's cache has no group {group!r}")
            rows = self.groups[group] = GroupRows(self.set.empty_rows[group], start)
        return rows

    def start_swa_at(self, layer: int, start: int) -> None:
        """Begin layer's window rows at `start` (rows below it are never stored)."""
        group = swa_group(layer)
        if group in self.groups and len(self.groups[group]):
            raise RuntimeError(f"{group} already holds rows")
        self.groups.pop(group, None)
        self.rows(group, start)

    # ---- compressor tails (ratio-2 owners) -----------------------------------------------
    def tail(self, owner: int) -> torch.Tensor | None:
        return self._tails.get(owner)

    def set_tail(self, owner: int, value: torch.Tensor | None) -> None:
        self._tails.pop(owner, None)
        if value is not None:
            self._tails[owner] = value.float().clone()

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
        """Forget every row; safe to call twice."""
        self.set.live.discard(self)
        self.groups.clear()
        self._tails.clear()
        self._journal.clear()
        self.released = True
