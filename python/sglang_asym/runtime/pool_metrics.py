"""PoolGauges: an engine's pool snapshot (runtime/pool_accounting.py) as Prometheus gauges, set at every scrape.

SGLang's names for what SGLang has (`sglang:token_usage`, `sglang:num_used_tokens`, `sglang:kv_used_tokens`,
...); `sglang_asym:` for the rest: pages per cache group, transfer slots by state, staging / landing extents
in use, open transfer rooms and Mooncake registrations. The transfer series exist only on P and D.
"""

from __future__ import annotations

from dataclasses import fields

from prometheus_client import CollectorRegistry, Gauge

from .pool_accounting import PoolSnapshot, TransferPoolUsage

SGLANG_FIGURES = {
    "token_usage": "Highest pool usage (0..1) over the window, compressed-KV and tail pools.",
    "full_token_usage": "Highest used-page share of the compressed-KV and index-key pools.",
    "swa_token_usage": "Highest used-page share of the sliding-window pools.",
    "num_used_tokens": "max(kv_used_tokens, swa_used_tokens).",
    "kv_used_tokens": "Tokens covered by the used pages of the busiest compressed-KV pool.",
    "kv_available_tokens": "Tokens the free pages of the tightest compressed-KV pool can still cover.",
    "swa_used_tokens": "Window rows (tokens) in used pages of the busiest sliding-window pool.",
    "swa_available_tokens": "Window rows (tokens) free in the tightest sliding-window pool.",
}
SLOT_STATES = tuple(f.name for f in fields(TransferPoolUsage) if f.name != "pool")


class PoolGauges:
    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        names = tuple(labels)
        self._labels = labels
        self._figures = {name: Gauge(f"sglang:{name}", doc, names, registry=registry).labels(**labels)
                         for name, doc in SGLANG_FIGURES.items()}
        self._total_pages = Gauge("sglang_asym:cache_total_pages", "Pages of one cache group's pool.",
                                  (*names, "cache_set", "cache_group"), registry=registry)
        self._free_pages = Gauge("sglang_asym:cache_free_pages", "Free pages of one cache group's pool.",
                                 (*names, "cache_set", "cache_group"), registry=registry)
        self._slots = Gauge("sglang_asym:transfer_pool_slots", "Transfer pool rows (staging / landing: 64-byte "
                            "blocks) by state.", (*names, "pool", "state"), registry=registry)
        self._rooms = Gauge("sglang_asym:transfer_open_rooms", "Transfer rooms not yet dropped.", names,
                            registry=registry)
        self._extents = Gauge("sglang_asym:staging_extents_in_use", "Staging (P) or landing (D) extents held.",
                              (*names, "buffer"), registry=registry)
        self._regions = Gauge("sglang_asym:mooncake_registered_regions", "Memory regions registered with "
                              "Mooncake by this process.", names, registry=registry)
        self._region_bytes = Gauge("sglang_asym:mooncake_registered_bytes", "Bytes registered with Mooncake.",
                                   names, registry=registry)

    def update(self, snap: PoolSnapshot) -> None:
        for name, value in snap.sglang_figures().items():
            self._figures[name].set(value)
        for c in snap.caches:
            self._total_pages.labels(**self._labels, cache_set=c.cache_set, cache_group=c.group).set(c.total_pages)
            self._free_pages.labels(**self._labels, cache_set=c.cache_set, cache_group=c.group).set(c.free_pages)
        t = snap.transfer
        if t is None:
            return
        for pool in t.pools:
            for state in SLOT_STATES:
                self._slots.labels(**self._labels, pool=pool.pool, state=state).set(getattr(pool, state))
        self._rooms.labels(**self._labels).set(t.open_rooms)
        if t.extent_buffer is not None:
            self._extents.labels(**self._labels, buffer=t.extent_buffer).set(t.extents_in_use)
        self._regions.labels(**self._labels).set(t.registered_regions)
        self._region_bytes.labels(**self._labels).set(t.registered_bytes)
