"""Row sites of every payload group in SGLang's DeepSeek-V4 pools (DeepSeekV4TokenToKVPool), from a
request's page ids: compressed KV, index keys, window (SWA) rows and the pending-pair ring rows.

A request's tokens [256k, 256k + 256) live in FULL page `full_pages[k]` and SWA page `swa_pages[k]`.
Compressed row j of a ratio-r source sits in FULL page full_pages[j * r // 256], slot j % (256 / r) of
that ratio's KV buffer (pages of 256 / r rows); its index key at index slot page * (256 / r) + slot
of 64-slot index pages; SWA token t at slot t % 256 of its SWA page; a ring row is a plain row.
"""

from __future__ import annotations

import torch

from .layouts import SGLANG_INDEX_PAGE_SIZE, SGLANG_PAGE_SIZE, index_page_layout, kv_page_layout
from .sites import PageLayout, RowSites, slots_from_page_table


def _rows(rows) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.int64).reshape(-1)


def kv_sites(name: str, buffer: torch.Tensor, layout: str, ratio: int, rows, full_pages) -> RowSites:
    """Compressed rows `rows` of a ratio-`ratio` KV buffer in SGLang layout `layout`."""
    per_page = SGLANG_PAGE_SIZE // ratio
    slots = slots_from_page_table(torch.as_tensor(full_pages, dtype=torch.int64), _rows(rows), per_page)
    return RowSites.paged(name, buffer, kv_page_layout(layout, per_page), slots.to(buffer.device))


def index_sites(name: str, buffer: torch.Tensor, index_head_dim: int, fp4: bool, ratio: int, rows, full_pages,
                index_page_size: int = SGLANG_INDEX_PAGE_SIZE) -> RowSites:
    """Index keys of compressed rows `rows` (a ratio-`ratio` source) in SGLang's index-K pages."""
    per_page = SGLANG_PAGE_SIZE // ratio
    slots = slots_from_page_table(torch.as_tensor(full_pages, dtype=torch.int64), _rows(rows), per_page)
    return RowSites.paged(name, buffer, index_page_layout(index_head_dim, fp4, index_page_size), slots.to(buffer.device))


def swa_sites(name: str, buffer: torch.Tensor, layout: str, tokens, swa_pages) -> RowSites:
    """Window rows of token positions `tokens` in an SWA buffer (256-token pages, layout `layout`)."""
    slots = slots_from_page_table(torch.as_tensor(swa_pages, dtype=torch.int64), _rows(tokens), SGLANG_PAGE_SIZE)
    return RowSites.paged(name, buffer, kv_page_layout(layout), slots.to(buffer.device))


def ring_sites(name: str, buffer: torch.Tensor, ring_rows) -> RowSites:
    """Rows `ring_rows` of a pending-pair ring buffer ([rows, row_bytes] of any dtype, contiguous)."""
    table = buffer.view(torch.uint8).reshape(buffer.shape[0], -1)
    return RowSites.paged(name, table, PageLayout.rows(int(table.shape[1])), _rows(ring_rows).to(buffer.device))


def pool_group_sites(pool, group: str, rows, full_pages, swa_pages, req_pool_idx: int, boundary: int) -> RowSites:
    """Sites of manifest group `group` ("kv.L{o}", "index.L{o}", "swa.L{i}", "tail.L{o}") of one
    request in a DeepSeekV4TokenToKVPool-shaped `pool` (read through its attributes: compression_ratios,
    sources_by_ratio, kv_pools, index_pools, swa_kv_pool, compress_state_pools), either layout.
    `rows`: compressed row numbers, or token positions for "swa"; a tail's row is the ring row of
    token boundary - 1."""
    kind, _, layer = group.partition(".L")
    layer = int(layer)
    if kind == "tail":
        ring = pool.compress_state_pools[layer]
        return ring_sites(group, ring.kv_score_buffer.kv_score,
                          [req_pool_idx * ring.ring_size + (boundary - 1) % ring.ring_size])
    if kind == "swa":
        swa = pool.swa_kv_pool
        return swa_sites(group, swa.kv_buffer[layer], swa.kv_layout.value, rows, swa_pages)
    ratio = pool.compression_ratios[layer]
    k = list(pool.sources_by_ratio[ratio]).index(layer)
    if kind == "kv":
        kv = pool.kv_pools[ratio]
        return kv_sites(group, kv.kv_buffer[k], kv.kv_layout.value, ratio, rows, full_pages)
    if kind == "index":
        index = pool.index_pools[ratio]
        return index_sites(group, index.index_k_with_scale_buffer[k], index.index_head_dim,
                           bool(index.use_fp4_indexer), ratio, rows, full_pages, index.page_size)
    raise ValueError(f"manifest group {group!r} has no place in a DeepSeek-V4 pool")
