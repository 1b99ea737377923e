"""Pool accounting: exact page, token and slot figures of a cache set and the transfer pools, as the snapshot,
/server_info's JSON and the Prometheus gauges give them."""

from __future__ import annotations

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from sglang_asym.cache import CacheSet, CacheSizing
from sglang_asym.config import V41Config
from sglang_asym.runtime.metrics import EngineMetrics
from sglang_asym.runtime.pool_accounting import (TransferPoolUsage, TransferUsage, allocator_pools, slot_report_pools,
                                                 snapshot)
from sglang_asym.transfer.extents import LANDING_POOL, ExtentAllocator
from sglang_asym.transfer.regions import RegisteredRegions
from sglang_asym.transfer.slots import DecodeSlots, SlotAllocator

# tiny: owners 1, 3 (ratio 2, with tails) and 5 (ratio 1); 2 requests of 256 tokens, 16-row pages:
# swa pools 2 * (ceil((256 + 128 + 16 + 16) / 16) + 1) = 54 pages, kv.L1/L3 2 * (ceil(129 / 16) + 1) = 20,
# kv.L5 2 * (ceil(257 / 16) + 1) = 36, tails 2 one-row pages.
SIZING = CacheSizing(max_requests=2, max_tokens=256, page_rows=16)
IDLE = {"token_usage": 0.0, "full_token_usage": 0.0, "swa_token_usage": 0.0, "num_used_tokens": 0,
        "kv_used_tokens": 0, "kv_available_tokens": 36 * 16, "swa_used_tokens": 0, "swa_available_tokens": 54 * 16}


@pytest.fixture
def cache_set() -> CacheSet:
    return CacheSet(V41Config.preset("tiny"), torch.float32, SIZING)


def _fill(cache_set: CacheSet):
    cfg = cache_set.cfg
    req = cache_set.new_request()
    req.rows("swa.L0").append(torch.zeros(40, cfg.head_dim))  # 3 pages
    req.rows("kv.L1").append(torch.zeros(5, cfg.head_dim))  # 1 page of ratio-2 rows: 32 tokens
    req.set_tail(1, torch.zeros(2, cfg.head_dim))  # 1 of 2 tail slots
    return req


def test_idle_cache_set_reports_every_group_free(cache_set):
    snap = snapshot({"requests": cache_set})
    assert snap.sglang_figures() == IDLE
    by_group = {c.group: (c.total_pages, c.free_pages, c.tokens_per_row) for c in snap.caches}
    assert by_group["swa.L0"] == (54, 54, 1) and by_group["swa.L8"] == (54, 54, 1)
    assert by_group["kv.L1"] == by_group["index.L3"] == (20, 20, 2)
    assert by_group["kv.L5"] == (36, 36, 1)
    assert by_group["tail.L1"] == (2, 2, 0) and "tail.L5" not in by_group
    assert len(snap.caches) == 9 + 3 * 2 + 2


def test_a_request_moves_the_figures_and_release_restores_them(cache_set):
    req = _fill(cache_set)
    figures = snapshot({"requests": cache_set}).sglang_figures()
    assert figures == {"token_usage": 0.5, "full_token_usage": 1 / 20, "swa_token_usage": 3 / 54,
                       "num_used_tokens": 48, "kv_used_tokens": 32, "kv_available_tokens": 36 * 16,
                       "swa_used_tokens": 48, "swa_available_tokens": 51 * 16}
    req.release()
    assert snapshot({"requests": cache_set}).sglang_figures() == IDLE


def test_scratch_sets_are_listed_but_not_counted_in_sglang_figures(cache_set):
    scratch = CacheSet(V41Config.preset("tiny"), torch.float32, SIZING)
    _fill(scratch)
    snap = snapshot({"requests": cache_set, "probe": scratch})
    assert snap.sglang_figures() == IDLE
    assert snap.to_json()["cache_pools"]["probe"]["swa.L0"] == {"page_rows": 16, "total_pages": 54, "free_pages": 51}
    with pytest.raises(ValueError, match="needs its 'requests' cache set"):
        snapshot({"probe": scratch})


def test_decode_slots_count_landing_holders_in_every_state():
    landing = ExtentAllocator(LANDING_POOL, 100)
    rows = SlotAllocator("kv.L1", 10)
    slots = DecodeSlots({"kv.L1": rows, LANDING_POOL: landing})
    open_room = {LANDING_POOL: landing.allocate(8)}
    direct_room = {"kv.L1": rows.allocate(3)}
    slots.hold(7, {LANDING_POOL: landing.allocate(4)}, release_at=1e18)
    slots.hand_over(9, {LANDING_POOL: landing.allocate(2)})
    active = [open_room, direct_room]
    assert slots.holders(LANDING_POOL, active) == 3 and slots.holders("kv.L1", active) == 1
    pools = slot_report_pools(slots.report(active))
    assert pools == (TransferPoolUsage("kv.L1", 10, 7, 3, 0, 0), TransferPoolUsage(LANDING_POOL, 100, 86, 8, 4, 2))
    slots.release_quarantine(7)
    slots.take_back(9)
    assert slots.holders(LANDING_POOL, [direct_room]) == 0


def test_registered_regions_sum_their_bytes():
    regions = RegisteredRegions()
    regions.add(0x1000, 256)
    regions.add(0x4000, 1024)
    assert (len(regions), regions.total_bytes) == (2, 1280)
    regions.remove(0x1000)
    assert regions.total_bytes == 1024


def _samples(metrics: EngineMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "role")))
            out[(s.name, labels)] = s.value
    return out


def test_metrics_read_the_probe_at_every_scrape(cache_set):
    staging = ExtentAllocator("staging", 64)
    source = SlotAllocator("kv.L1", 12)
    held = source.allocate(5)
    transfer = lambda: TransferUsage(1, allocator_pools([source, staging]), "staging", 0, 3, 4096)  # noqa: E731
    metrics = EngineMetrics("tiny", "prefill")
    metrics.attach_pool_probe(lambda: snapshot({"requests": cache_set}, transfer()))
    s = _samples(metrics)
    assert s[("sglang:token_usage", ())] == 0.0 and s[("sglang:kv_available_tokens", ())] == 36 * 16
    assert s[("sglang_asym:cache_total_pages", (("cache_group", "kv.L5"), ("cache_set", "requests")))] == 36
    assert s[("sglang_asym:transfer_pool_slots", (("pool", "kv.L1"), ("state", "active")))] == 5
    assert s[("sglang_asym:transfer_pool_slots", (("pool", "kv.L1"), ("state", "free")))] == 7
    assert s[("sglang_asym:transfer_pool_slots", (("pool", "staging"), ("state", "capacity")))] == 64
    assert s[("sglang_asym:transfer_open_rooms", ())] == 1
    assert s[("sglang_asym:staging_extents_in_use", (("buffer", "staging"),))] == 0
    assert (s[("sglang_asym:mooncake_registered_regions", ())], s[("sglang_asym:mooncake_registered_bytes", ())]) \
        == (3, 4096)
    req = _fill(cache_set)
    source.free(held)
    s = _samples(metrics)
    assert s[("sglang:num_used_tokens", ())] == 48 and s[("sglang:token_usage", ())] == 0.5
    assert s[("sglang_asym:cache_free_pages", (("cache_group", "swa.L0"), ("cache_set", "requests")))] == 51
    assert s[("sglang_asym:transfer_pool_slots", (("pool", "kv.L1"), ("state", "free")))] == 12
    req.release()
    with pytest.raises(RuntimeError, match="already attached"):
        metrics.attach_pool_probe(lambda: snapshot({"requests": cache_set}))


def test_colocated_snapshot_has_no_transfer_series(cache_set):
    metrics = EngineMetrics("tiny", "null")
    metrics.attach_pool_probe(lambda: snapshot({"requests": cache_set}))
    names = {name for name, _ in _samples(metrics)}
    assert "sglang:swa_token_usage" in names
    assert not {n for n in names if "transfer_pool" in n or "mooncake" in n or "open_rooms" in n}
    assert "transfer" not in snapshot({"requests": cache_set}).to_json()
