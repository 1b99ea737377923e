"""Shared setup of the kernel tests: small DeepSeek-V4 pools in SGLang's layouts filled with random
bytes, random page tables, the manifest's groups of a request cut at B as row sites, and the
expected wire bytes computed independently (one row at a time from the page formulas)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_kernel_ext import (RowSites, compressed_kv_layout, index_sites, kv_sites, ring_sites, swa_sites)
from sgl_kernel_ext.layouts import KV_FORMATS, SGLANG_INDEX_PAGE_SIZE, SGLANG_PAGE_SIZE

INDEX_HEAD_DIM = 128
OWNERS = {2: 2, 8: 2, 20: 1}     # KV source layer -> compression ratio
ENCODER = (0, 1)                 # layers whose window rows ship (exact-encoder handoff)
SLIDING = 128                    # rows [B - 127, B) ship
RING = 2                         # pending-pair ring rows per request
FULL_PAGES, SWA_PAGES, REQS = 5, 4, 3


def _random(shape, gen) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)


@dataclass
class Pools:
    """One side's buffers: per KV source a KV buffer and an index-K buffer, per encoder layer an SWA
    buffer, per ratio-2 source a ring (fp32 [reqs * RING, 2 * 512], as SGLang's kv_score rows)."""

    main: str
    kv: dict[int, torch.Tensor]
    index: dict[int, torch.Tensor]
    swa: dict[int, torch.Tensor]
    ring: dict[int, torch.Tensor]

    @classmethod
    def build(cls, main: str, seed: int) -> "Pools":
        gen = torch.Generator().manual_seed(seed)
        kv, index = {}, {}
        for layer, ratio in OWNERS.items():
            page = _page_bytes(compressed_kv_layout(main, ratio), SGLANG_PAGE_SIZE // ratio)
            kv[layer] = _random((FULL_PAGES, page), gen)
            index_pages = FULL_PAGES * (SGLANG_PAGE_SIZE // ratio) // SGLANG_INDEX_PAGE_SIZE
            index[layer] = _random((index_pages, SGLANG_INDEX_PAGE_SIZE * (INDEX_HEAD_DIM // 2 + INDEX_HEAD_DIM // 32)),
                                   gen)
        swa = {i: _random((SWA_PAGES, _page_bytes(main, SGLANG_PAGE_SIZE)), gen) for i in ENCODER}
        ring = {layer: _random((REQS * RING, 2 * 512 * 4), gen).view(torch.float32)
                for layer, ratio in OWNERS.items() if ratio == 2}
        return cls(main, kv, index, swa, ring)

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.tensors()]

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer as bytes (the rings are fp32: random bytes hold NaNs, compared bitwise here)."""
        return [t.view(torch.uint8) for d in (self.kv, self.index, self.swa, self.ring) for t in d.values()]


def _page_bytes(layout: str, page_size: int) -> int:
    f = KV_FORMATS[layout]
    raw = page_size * (f.data_bytes + f.scale_bytes)
    return -(-raw // f.page_align) * f.page_align


@dataclass(frozen=True)
class Request:
    boundary: int
    full_pages: tuple[int, ...]
    swa_pages: tuple[int, ...]
    req_pool_idx: int

    @classmethod
    def random(cls, boundary: int, seed: int) -> "Request":
        gen = torch.Generator().manual_seed(seed)
        need = -(-boundary // SGLANG_PAGE_SIZE)
        full = torch.randperm(FULL_PAGES, generator=gen)[:need].tolist()
        swa = torch.randperm(SWA_PAGES, generator=gen)[:need].tolist()
        return cls(boundary, tuple(full), tuple(swa), int(torch.randint(0, REQS, (1,), generator=gen)))

    def groups(self) -> list[tuple[str, int, int]]:
        """(kind, layer, rows) in manifest order: per owner kv, index (and a tail when B is odd for
        ratio 2), then the encoder's window rows. Empty groups stay in (0 rows)."""
        b, out = self.boundary, []
        for layer, ratio in OWNERS.items():
            out += [("kv", layer, b // ratio), ("index", layer, b // ratio)]
            if ratio == 2 and b % 2:
                out.append(("tail", layer, 1))
        lo = max(b - (SLIDING - 1), 0)
        out += [("swa", i, b - lo) for i in ENCODER]
        return out

    def sites(self, pools: Pools) -> list[RowSites]:
        out = []
        for kind, layer, n in self.groups():
            name = f"{kind}.L{layer}"
            if kind == "kv":
                ratio = OWNERS[layer]
                out.append(kv_sites(name, pools.kv[layer], compressed_kv_layout(pools.main, ratio), ratio,
                                    range(n), self.full_pages))
            elif kind == "index":
                out.append(index_sites(name, pools.index[layer], INDEX_HEAD_DIM, True, OWNERS[layer], range(n),
                                       self.full_pages))
            elif kind == "tail":
                out.append(ring_sites(name, pools.ring[layer], [self.req_pool_idx * RING + (self.boundary - 1) % RING]))
            else:
                lo = self.boundary - n
                out.append(swa_sites(name, pools.swa[layer], pools.main, range(lo, self.boundary), self.swa_pages))
        return out

    def expected(self, pools: Pools) -> bytes:
        """The wire bytes, one row at a time from the page formulas (no RowSites, no index ops)."""
        out = bytearray()
        for kind, layer, n in self.groups():
            if kind == "tail":
                ring = pools.ring[layer].view(torch.uint8)
                out += bytes(ring[self.req_pool_idx * RING + (self.boundary - 1) % RING].tolist())
                continue
            if kind == "index":
                per = SGLANG_PAGE_SIZE // OWNERS[layer]
                buf, data, scale = pools.index[layer], INDEX_HEAD_DIM // 2, INDEX_HEAD_DIM // 32
                for j in range(n):
                    page, slot = divmod(self.full_pages[j // per] * per + j % per, SGLANG_INDEX_PAGE_SIZE)
                    row = buf[page]
                    out += bytes(row[slot * data:(slot + 1) * data].tolist())
                    base = SGLANG_INDEX_PAGE_SIZE * data + slot * scale
                    out += bytes(row[base:base + scale].tolist())
                continue
            if kind == "kv":
                per, fmt, buf = SGLANG_PAGE_SIZE // OWNERS[layer], KV_FORMATS[compressed_kv_layout(pools.main, OWNERS[layer])], pools.kv[layer]
                rows = [(self.full_pages[j // per], j % per) for j in range(n)]
            else:
                per, fmt, buf = SGLANG_PAGE_SIZE, KV_FORMATS[pools.main], pools.swa[layer]
                rows = [(self.swa_pages[t // per], t % per) for t in range(self.boundary - n, self.boundary)]
            for page, slot in rows:
                row = buf[page]
                if fmt.interleaved:
                    size = fmt.data_bytes + fmt.scale_bytes
                    out += bytes(row[slot * size:(slot + 1) * size].tolist())
                else:
                    out += bytes(row[slot * fmt.data_bytes:(slot + 1) * fmt.data_bytes].tolist())
                    base = per * fmt.data_bytes + slot * fmt.scale_bytes
                    out += bytes(row[base:base + fmt.scale_bytes].tolist())
        return bytes(out)
