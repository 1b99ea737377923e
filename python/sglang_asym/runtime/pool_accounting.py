"""Pool usage of one engine as a snapshot: cache pages per group, transfer slots, staging/landing extents,
open transfer rooms and Mooncake registrations, with SGLang's token-usage figures derived from them.

The snapshot feeds /metrics (runtime/metrics.py sets its gauges from it at every scrape) and /server_info
(`internal_states[0]`). SGLang's figures are defined on the engine's request cache set only (scratch sets
such as D's health-probe cache show up per group, labelled by their set):

- `token_usage` = max(full_token_usage, swa_token_usage, share of compressor-tail slots in use), SGLang's
  "bottleneck over all pools" (the tails play the role of SGLang's per-request state pools);
- `full_token_usage` = the highest used-page share over the compressed-KV and index-key groups;
- `swa_token_usage` = the highest used-page share over the sliding-window groups;
- `kv_used_tokens` / `kv_available_tokens` = prompt tokens covered by the used / free pages of the
  compressed-KV groups (a row covers `compress_ratio` tokens), busiest group / tightest group;
- `swa_used_tokens` / `swa_available_tokens` = the same for the window groups (a row is one token);
- `num_used_tokens` = max(kv_used_tokens, swa_used_tokens), as SGLang counts hybrid SWA models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from ..cache import CacheSet, parse_group

REQUESTS = "requests"  # the cache set that holds the served requests (SGLang's figures come from it)


@dataclass(frozen=True)
class CachePoolUsage:
    cache_set: str  # "requests", or a scratch set ("probe", "prefix")
    group: str  # swa.L{i} / kv.L{o} / index.L{o} / tail.L{o}
    page_rows: int
    total_pages: int
    free_pages: int
    tokens_per_row: int  # 1 for window rows, the compress ratio for kv / index rows, 0 for tails

    @property
    def kind(self) -> str:
        return self.group.split(".")[0]

    @property
    def used_pages(self) -> int:
        return self.total_pages - self.free_pages

    @property
    def usage(self) -> float:
        return self.used_pages / self.total_pages


@dataclass(frozen=True)
class TransferPoolUsage:
    """One transfer pool (rows of a payload group, or blocks of the staging / landing buffer)."""

    pool: str
    capacity: int
    free: int
    active: int  # held by open rooms (P: by requests in flight)
    quarantined: int = 0  # D: rows of failed rooms a late write could still reach
    handed_over: int = 0  # D: rows of succeeded rooms the engine has not released yet


@dataclass(frozen=True)
class TransferUsage:
    open_rooms: int
    pools: tuple[TransferPoolUsage, ...]
    extent_buffer: str | None  # "staging" (P), "landing" (D), None without a buffer
    extents_in_use: int
    registered_regions: int  # Mooncake registrations of this process
    registered_bytes: int


@dataclass(frozen=True)
class PoolSnapshot:
    caches: tuple[CachePoolUsage, ...]
    transfer: TransferUsage | None  # None on a colocated server

    def _requests(self, *kinds: str) -> list[CachePoolUsage]:
        return [c for c in self.caches if c.cache_set == REQUESTS and c.kind in kinds]

    def _usage(self, *kinds: str) -> float:
        return max((c.usage for c in self._requests(*kinds)), default=0.0)

    def _tokens(self, kind: str, used: bool) -> int:
        pools = self._requests(kind)
        if not pools:
            return 0
        per_pool = [(c.used_pages if used else c.free_pages) * c.page_rows * c.tokens_per_row for c in pools]
        return max(per_pool) if used else min(per_pool)

    def sglang_figures(self) -> dict[str, float | int]:
        full, swa = self._usage("kv", "index"), self._usage("swa")
        kv_used, swa_used = self._tokens("kv", True), self._tokens("swa", True)
        return {"token_usage": max(full, swa, self._usage("tail")), "full_token_usage": full,
                "swa_token_usage": swa, "num_used_tokens": max(kv_used, swa_used),
                "kv_used_tokens": kv_used, "kv_available_tokens": self._tokens("kv", False),
                "swa_used_tokens": swa_used, "swa_available_tokens": self._tokens("swa", False)}

    def to_json(self) -> dict[str, Any]:
        caches: dict[str, dict[str, dict[str, int]]] = {}
        for c in self.caches:
            caches.setdefault(c.cache_set, {})[c.group] = {
                "page_rows": c.page_rows, "total_pages": c.total_pages, "free_pages": c.free_pages}
        out: dict[str, Any] = {**self.sglang_figures(), "cache_pools": caches}
        if self.transfer is not None:
            t = self.transfer
            out["transfer"] = {"open_rooms": t.open_rooms, "extent_buffer": t.extent_buffer,
                               "extents_in_use": t.extents_in_use,
                               "mooncake_registered_regions": t.registered_regions,
                               "mooncake_registered_bytes": t.registered_bytes,
                               "pools": {p.pool: {k: v for k, v in asdict(p).items() if k != "pool"}
                                         for p in t.pools}}
        return out


def cache_usage(cache_set: CacheSet, name: str) -> list[CachePoolUsage]:
    """Per-group page usage of one cache set."""
    out = []
    for group, pool in cache_set.pools.items():
        spec = pool.spec
        out.append(CachePoolUsage(name, group, spec.page_rows, spec.num_pages, pool.free_pages,
                                  parse_group(group).tokens_per_row(cache_set.cfg)))
    return out


def snapshot(cache_sets: Mapping[str, CacheSet], transfer: TransferUsage | None = None) -> PoolSnapshot:
    if REQUESTS not in cache_sets:
        raise ValueError(f"an engine's pool snapshot needs its {REQUESTS!r} cache set, got {sorted(cache_sets)}")
    caches: list[CachePoolUsage] = []
    for name, cache_set in cache_sets.items():
        caches += cache_usage(cache_set, name)
    return PoolSnapshot(tuple(caches), transfer)


def allocator_pools(allocators: Iterable[Any]) -> tuple[TransferPoolUsage, ...]:
    """P's source-slot allocators (and its staging extents): what is not free is held by a request."""
    return tuple(TransferPoolUsage(a.name, a.capacity, a.num_free, a.capacity - a.num_free) for a in allocators)


def slot_report_pools(report: Mapping[str, Mapping[str, int]]) -> tuple[TransferPoolUsage, ...]:
    """D's DecodeSlots report (pool -> capacity / free / active / quarantined / handed_over)."""
    return tuple(TransferPoolUsage(name, **row) for name, row in report.items())
