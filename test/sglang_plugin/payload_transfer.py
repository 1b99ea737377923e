"""What SGLang's own Mooncake sender moves for an asymmetric room, on CPU without a peer: our packed rows
written into and read from SGLang's pool (`write_payload`, `read_payload`), the registered entries and item
indices of the payload (`asym_send_entries`), and the (src, dst, length) blocks SGLang's transfer planner
hands the transfer engine (`sglang_transfer_blocks`), performed as a local copy (`apply_blocks`). Test
harness for sglang_cpu_checks.py: the product moves the payload with the exact-payload manager
(prefill/exact_payload.py)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from sglang_asym.cache.groups import parse_group
from sglang_asym.split import SplitPlan
from sglang_asym.sglang_plugin.shared.kv_pool import PAGE_SIZE, pool_row_format
from sglang_asym.sglang_plugin.shared.pool_payload import (CONTIGUOUS, REQUEST_STATE, STATE, PoolEntry, PoolPayloadError,
                                                           RequestPages, _page_of, group_rows, pool_entries, row_sites)


def write_payload(pool: Any, pages: RequestPages, split: SplitPlan, rows: dict[str, np.ndarray]) -> None:
    """Writes our packed rows (uint8 [n, row_bytes] per manifest group) into SGLang's pool."""
    manifest = split.manifest(pool_row_format(pool)).nonempty()
    if set(rows) != {g.name for g in manifest.groups}:
        raise PoolPayloadError(f"payload groups {sorted(rows)} are not the manifest's "
                               f"{sorted(g.name for g in manifest.groups)}")
    for group in manifest.groups:
        data = np.ascontiguousarray(rows[group.name])
        if data.dtype != np.uint8 or data.shape != (group.num_rows, group.row_bytes):
            raise PoolPayloadError(f"{group.name}: expected uint8 {(group.num_rows, group.row_bytes)}, "
                                   f"got {data.dtype} {data.shape}")
        sites = row_sites(pool, group.name, group_rows(split, group.name, group.num_rows), pages,
                       split, group.row_bytes)
        source = torch.from_numpy(data)
        for row, site in zip(source, sites):
            at = 0
            for offset, length in site.parts:
                site.buffer[site.page, offset:offset + length] = row[at:at + length]
                at += length


def read_payload(pool: Any, pages: RequestPages, split: SplitPlan) -> dict[str, np.ndarray]:
    """The manifest's rows as they sit in SGLang's pool, re-joined as our packed rows."""
    out = {}
    for group in split.manifest(pool_row_format(pool)).nonempty().groups:
        sites = row_sites(pool, group.name, group_rows(split, group.name, group.num_rows), pages,
                       split, group.row_bytes)
        out[group.name] = np.stack([
            torch.cat([site.buffer[site.page, offset:offset + length] for offset, length in site.parts]).numpy()
            for site in sites
        ])
    return out


@dataclass(frozen=True)
class SendEntries:
    """One of SGLang's send calls for the asymmetric payload: which registered entries, their layer
    ids, and the item indices of this request."""

    buffer_list: str
    entries: tuple[PoolEntry, ...]
    indices: tuple[int, ...]


def _entry_of_group(pool: Any, group: str) -> PoolEntry:
    gid = parse_group(group)
    kind, layer = gid.kind.value, gid.layer
    entries = pool_entries(pool)
    if kind in ("kv", "index"):
        ratio = pool.compression_ratios[layer]
        name, listed = f"{kind}.c{ratio}.L{layer}", entries[CONTIGUOUS]
    elif kind == "swa":
        name, listed = f"swa.L{layer}", entries[STATE]
    elif kind == "tail":
        name, listed = f"pair_ring.L{layer}", entries[REQUEST_STATE]
    else:
        raise PoolPayloadError(f"manifest group {group!r} has no place in SGLang's pool")
    for entry in listed:
        if entry.name == name:
            return entry
    raise PoolPayloadError(f"SGLang's pool registers no buffer {name} for manifest group {group!r}")


def asym_send_entries(pool: Any, pages: RequestPages, split: SplitPlan) -> tuple[SendEntries, ...]:
    """The registered entries and item indices the asymmetric payload of `split` occupies."""
    manifest = split.manifest(pool_row_format(pool)).nonempty()
    if not manifest.groups:
        return ()
    chosen: dict[str, list[PoolEntry]] = {CONTIGUOUS: [], STATE: [], REQUEST_STATE: []}
    for group in manifest.groups:
        entry = _entry_of_group(pool, group.name)
        if entry not in chosen[entry.buffer_list]:
            chosen[entry.buffer_list].append(entry)
    b = split.boundary
    indices = {CONTIGUOUS: tuple(pages.full_pages[k] for k in range(-(-b // PAGE_SIZE)))}
    start, end = split.encoder_swa_rows
    if end > start:
        swa_page_size = pool.swa_kv_pool.page_size
        indices[STATE] = tuple(_page_of(pages.swa_pages, t, "swa")
                               for t in range(start // swa_page_size * swa_page_size, end, swa_page_size))
    if chosen[REQUEST_STATE]:
        indices[REQUEST_STATE] = tuple(int(i) for i in pool.request_state_transfer_indices(pages.req_pool_idx, b))
    return tuple(SendEntries(kind, tuple(sorted(chosen[kind], key=lambda e: e.index)), indices[kind])
                 for kind in (CONTIGUOUS, STATE, REQUEST_STATE) if chosen[kind])


def _buf_infos(pool: Any, buffer_list: str) -> tuple[list[int], list[int], list[int]]:
    return {CONTIGUOUS: pool.get_contiguous_buf_infos, STATE: pool.get_state_buf_infos,
            REQUEST_STATE: pool.get_request_state_buf_infos}[buffer_list]()


class _CapturingSender:
    """Stands in for a MooncakeKVManager's state where SGLang's transfer planner reads it; the
    transfer engine's batch write is replaced by recording (src, dst, length) blocks."""

    is_mla_backend = True
    is_hybrid_mla_backend = False
    pp_size = 1
    enable_custom_mem_pool = False
    custom_mem_pool_type = None
    max_transfer_batch_indices = 0

    def __init__(self) -> None:
        self.state_strides_validated: set[str] = set()
        self.blocks: list[tuple[int, int, int]] = []

    def _transfer_data(self, session_id: str, transfer_blocks: list[tuple[int, int, int]]) -> int:
        self.blocks.extend((int(s), int(d), int(n)) for s, d, n in transfer_blocks)
        return 0


@dataclass(frozen=True)
class TransferBlock:
    src: int
    dst: int
    length: int
    entry: str  # the sender's registered entry the block reads


def sglang_transfer_blocks(src_pool: Any, src_pages: RequestPages, dst_pool: Any, dst_pages: RequestPages,
                           split: SplitPlan) -> list[TransferBlock]:
    """The (src, dst, length) blocks SGLang's `MooncakeKVManager._send_kvcache_generic` hands to the
    transfer engine for the asymmetric payload: P's entries from `asym_send_entries`, D's every
    registered entry, paired by layer id."""
    from sglang.srt.disaggregation.base.conn import StateType
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    state_types = {CONTIGUOUS: None, STATE: StateType.SWA, REQUEST_STATE: StateType.DSV4_REQUEST_STATE}
    dst_entries = pool_entries(dst_pool)
    dst_plan = {s.buffer_list: s for s in asym_send_entries(dst_pool, dst_pages, split)}
    blocks: list[TransferBlock] = []
    for send in asym_send_entries(src_pool, src_pages, split):
        src_ptrs, src_lens, src_item_lens = _buf_infos(src_pool, send.buffer_list)
        dst_ptrs, _, _ = _buf_infos(dst_pool, send.buffer_list)
        capture = _CapturingSender()
        rc = MooncakeKVManager._send_kvcache_generic(
            capture,
            mooncake_session_id="capture",
            src_data_ptrs=[src_ptrs[e.index] for e in send.entries],
            dst_data_ptrs=dst_ptrs,
            item_lens=[src_item_lens[e.index] for e in send.entries],
            prefill_data_indices=np.array(send.indices, dtype=np.int32),
            dst_data_indices=np.array(dst_plan[send.buffer_list].indices, dtype=np.int32),
            executor=None,
            state_type=state_types[send.buffer_list],
            src_layer_ids=[e.layer for e in send.entries],
            dst_layer_ids=[e.layer for e in dst_entries[send.buffer_list]],
        )
        if rc != 0:
            raise PoolPayloadError(f"SGLang's transfer planner returned {rc} for the {send.buffer_list} entries")
        for src, dst, length in capture.blocks:
            entry = next(e for e in send.entries if src_ptrs[e.index] <= src < src_ptrs[e.index] + src_lens[e.index])
            blocks.append(TransferBlock(src, dst, length, entry.name))
    return blocks


def read_block(block: TransferBlock) -> bytes:
    """The bytes a block moves, read at its source address (what the transfer engine sends)."""
    return ctypes.string_at(block.src, block.length)


def apply_blocks(blocks: Sequence[TransferBlock]) -> None:
    """Performs the blocks as a local copy (what Mooncake's write does between two hosts' memory)."""
    for block in blocks:
        ctypes.memmove(block.dst, block.src, block.length)
