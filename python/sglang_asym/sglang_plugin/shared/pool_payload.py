"""The asymmetric payload inside SGLang's DeepSeekV4TokenToKVPool: where each manifest row lives, and
what SGLang's Mooncake manager moves for one request.

Row sites (SGLang's `v41` KV layout; in a `v4` pool the kv and swa rows are V4 rows of 576 data and 8
scale bytes, kv_pool.pool_row_format; every offset comes from SGLang's own pool objects):
  kv.L{o}     compressed main KV of KV source o, ratio r: pool `kv_pools[r].kv_buffer[k]` (k: o's
              position in `sources_by_ratio[r]`). Compressed row j sits in FULL page
              `full_pages[j*r // 256]`, slot `j % (256/r)`; inside a page SGLang's KVLayout is
              block-split (`row_addressing`): all slots' 256 data bytes, then all slots' 32 scale bytes.
  index.L{o}  index keys: `index_pools[r].index_k_with_scale_buffer[k]`, index slot
              loc = page * (256/r) + j % (256/r) in 64-slot index pages laid out as 64 x 64 fp4 bytes
              then 64 x 4 ue8m0 bytes (`DeepSeekV4IndexerPool.get_index_k_fp4`).
  swa.L{i}    window KV of layer i: `swa_kv_pool.kv_buffer[i]`, token t in SWA page
              `swa_pages[t // 256]`, slot t % 256, block-split 512 fp8 bytes / 16 ue8m0 bytes.
  tail.L{o}   the pending token of a ratio-2 source when B is odd: the request's pair ring
              `compress_state_pools[o]` row `req_pool_idx * ring + (B-1) % ring`: fp32 [kv | score].
Our packed rows (formats/rows.py) are `data || scales` per row: the same bytes, split across the page.

What SGLang moves (`MooncakeKVManager._send_kvcache_generic`, the code its sender runs): whole
items at page indices, i.e. for every buffer entry it sends, `item_len` bytes per page index
(coalesced into contiguous runs). `pool_entries` names every registered entry with its model layer id,
which is how SGLang pairs a sender's entries with a peer that registered all of its own
(`build_transfer_entry_pairs`); test/sglang_plugin/payload_transfer.py replays that sender on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...cache.groups import KIND_FORMATS, GroupKind, parse_group
from ...config import V41Config
from ...split import SplitPlan
from .kv_pool import PAGE_SIZE, pool_row_format

CONTIGUOUS, STATE, REQUEST_STATE = "contiguous", "state", "request_state"


class PoolPayloadError(ValueError):
    """A request or payload that does not fit SGLang's pool (names the group or page)."""


@dataclass(frozen=True)
class RequestPages:
    """Where one request lives in a DeepSeekV4TokenToKVPool, in SGLang's own ids."""

    full_pages: tuple[int, ...]  # page id of tokens [256k, 256k + 256), k = 0, 1, ...
    swa_pages: tuple[int | None, ...]  # SWA page id of the same token pages (None: no SWA page)
    req_pool_idx: int


@dataclass(frozen=True)
class PoolEntry:
    """One registered buffer: its list, its index in SGLang's registration order, and its layer."""

    buffer_list: str
    index: int
    layer: int
    name: str


def pool_entries(pool: Any) -> dict[str, tuple[PoolEntry, ...]]:
    """SGLang's three registered buffer lists, in its registration order."""
    contiguous = []
    for ratio, sources in pool.sources_by_ratio.items():
        contiguous += [(f"kv.c{ratio}.L{o}", o) for o in sources]
        contiguous += [(f"index.c{ratio}.L{o}", o) for o in sources]
    state = [(f"swa.L{i}", i) for i in range(len(pool.compression_ratios))]
    rings = [(f"pair_ring.L{o}", o) for o in pool.sources_by_ratio.get(2, ())]
    return {
        kind: tuple(PoolEntry(kind, i, layer, name) for i, (name, layer) in enumerate(entries))
        for kind, entries in ((CONTIGUOUS, contiguous), (STATE, state), (REQUEST_STATE, rings))
    }


# ---- row sites ------------------------------------------------------------------------------


def _split_row(kind: str, row_format: str, cfg: V41Config, row_bytes: int) -> tuple[int, int]:
    """(data bytes, scale bytes) of one of our packed rows."""
    fmt = KIND_FORMATS[GroupKind(kind)]
    codec = fmt.packed(row_format, cfg)
    data, scales = codec.parts(fmt.channels(cfg))
    if data + scales != row_bytes:
        raise PoolPayloadError(f"{kind} rows of {row_bytes} bytes are not {codec.fmt} rows of {fmt.channels(cfg)} "
                               f"channels")
    return data, scales


def _page_of(pages: Sequence[int | None], token: int, what: str) -> int:
    k = token // PAGE_SIZE
    page = pages[k] if k < len(pages) else None
    if page is None:
        raise PoolPayloadError(f"{what}: token {token} has no page in this request's page list")
    return page


@dataclass(frozen=True)
class Site:
    buffer: torch.Tensor  # 2-D uint8 view [pages, page bytes]
    page: int
    parts: tuple[tuple[int, int], ...]  # (byte offset in the page, length), in row byte order


def row_sites(pool: Any, group: str, rows: range, pages: RequestPages, split: SplitPlan,
           row_bytes: int, ring_rows: int | None = None) -> list[Site]:
    """Where `rows` of manifest group `group` live for the request at `pages`. `ring_rows`: the pair
    ring's rows per request where they differ from `pool`'s (the peer's pool, whose layout `pool`
    otherwise stands in for: a decode peer with speculative decoding keeps a wider ring)."""
    boundary = split.boundary
    gid = parse_group(group)
    kind, layer = gid.kind.value, gid.layer
    if kind == "tail":
        ring = pool.compress_state_pools[layer]
        if ring is None or not ring.request_scoped or ring.ratio != 2:
            raise PoolPayloadError(f"{group}: layer {layer} has no ratio-2 pending-pair ring")
        buf = ring.kv_score_buffer.kv_score
        if buf[0].nbytes != row_bytes:
            raise PoolPayloadError(f"{group}: SGLang's ring row is {buf[0].nbytes} bytes, ours {row_bytes}")
        ring_size = ring.ring_size if ring_rows is None else ring_rows
        row = pages.req_pool_idx * ring_size + (boundary - 1) % ring_size
        return [Site(buf.view(torch.uint8), row, ((0, row_bytes),))]
    ratio = pool.compression_ratios[layer]
    if kind == "swa":
        swa = pool.swa_kv_pool
        layout, buf, page_size = swa.kv_layout, swa.kv_buffer[layer], swa.page_size
        if page_size != PAGE_SIZE:
            raise PoolPayloadError(f"{group}: SWA pages of {page_size} tokens, expected {PAGE_SIZE}")
    else:
        k = list(pool.sources_by_ratio[ratio]).index(layer)
        if kind == "kv":
            kv = pool.kv_pools[ratio]
            layout, buf, page_size = kv.kv_layout, kv.kv_buffer[k], kv.page_size
        else:
            layout, buf, page_size = None, pool.index_pools[ratio].index_k_with_scale_buffer[k], None
    data_bytes, scale_bytes = _split_row(kind, pool_row_format(pool), split.config, row_bytes)
    buf = buf.view(torch.uint8)
    sites = []
    for j in rows:
        if kind == "swa":
            slot = j % page_size
            page = _page_of(pages.swa_pages, j, group)
        else:
            per_page = PAGE_SIZE // ratio
            page = _page_of(pages.full_pages, j * ratio, group)
            slot = j % per_page
        if kind == "index":
            index_page_size = pool.index_pools[ratio].page_size
            loc = page * (PAGE_SIZE // ratio) + slot
            page, slot = divmod(loc, index_page_size)
            sites.append(Site(buf, page, ((slot * data_bytes, data_bytes),
                                           (index_page_size * data_bytes + slot * scale_bytes, scale_bytes))))
            continue
        if (layout.data_bytes, layout.scale_bytes) != (data_bytes, scale_bytes):
            raise PoolPayloadError(f"{group}: SGLang's {layout.value} rows are {layout.data_bytes}+"
                                   f"{layout.scale_bytes} bytes, ours {data_bytes}+{scale_bytes}")
        data_stride, scale_base, scale_stride = layout.row_addressing(page_size)
        sites.append(Site(buf, page, ((slot * data_stride, data_bytes),
                                       (scale_base + slot * scale_stride, scale_bytes))))
    return sites


def group_rows(split: SplitPlan, group: str, num_rows: int) -> range:
    """The request-relative row numbers a manifest group covers (token positions for SWA)."""
    if parse_group(group).kind is GroupKind.SWA:
        start, end = split.encoder_swa_rows
        if end - start != num_rows:
            raise PoolPayloadError(f"{group}: {num_rows} rows where the split ships [{start}, {end})")
        return range(start, end)
    return range(num_rows)
