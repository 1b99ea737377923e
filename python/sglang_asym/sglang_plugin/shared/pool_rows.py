"""Cache rows of one request in SGLang's DeepSeekV4TokenToKVPool, read and written by request position.

The reference model's cache groups (cache/request.py) live in SGLang's pool at these sites (the same
placement pool_payload.py uses for the transfer manifest, here vectorised over many rows):
  swa.L{i}    token t: SWA slot full_to_swa[req_to_token[r, t]] of `swa_kv_pool.kv_buffer[i]`
              (fp8 rows in a `v41` pool, V4 rows in a `v4` one; block-split pages: every slot's data,
              then every slot's scales)
  kv.L{o}     compressed row j of a ratio-q source: slot req_to_token[r, j*q] // q of
              `kv_pools[q].kv_buffer[k]` (nvfp4 rows in `v41`, V4 rows in `v4`; block-split pages of 256/q slots)
  index.L{o}  the same slot in `index_pools[q].index_k_with_scale_buffer[k]` (mxfp4: 64-slot pages,
              all codes then all scales)
  tail.L{o}   a ratio-2 source's pending token t: ring row r * ring + t % ring of
              `compress_state_pools[o]` (fp32 value | gate)
Rows move as packed bytes in the pool's row format (kv_pool.pool_row_format), which the model's caches
round-trip exactly when it quantizes them the same way (`release` for v41, `v4` for v4), so the pool's
bytes are the request state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ...cache.groups import KIND_FORMATS, GroupKind
from ...config import V41Config
from ...formats import CacheFormat
from .kv_pool import PAGE_SIZE, ROW_FORMAT_OF_LAYOUT, pool_row_format


class PoolRowsError(RuntimeError):
    """The pool cannot hold the reference model's rows as asked (names the group and why)."""


@dataclass(frozen=True)
class _Placement:
    buffer: torch.Tensor  # flat uint8 view of one registered buffer
    page_bytes: int
    data_bytes: int
    scale_bytes: int
    fmt: CacheFormat
    channels: int


class PoolRows:
    """Row access for one SGLang pool, for the reference model of `cfg`."""

    def __init__(self, pool: Any, req_to_token: torch.Tensor, cfg: V41Config) -> None:
        layout = pool.kv_layout.value  # the main (SWA) layout; compressed layouts are checked per ratio
        if layout not in ROW_FORMAT_OF_LAYOUT:
            raise PoolRowsError(f"the CPU route's reference layers read SGLang's {' / '.join(ROW_FORMAT_OF_LAYOUT)} pool layouts, "
                                f"this pool is {layout!r} (set SGLANG_DSV4_KV_LAYOUT)")
        self.pool, self.req_to_token, self.cfg = pool, req_to_token, cfg
        self.row_format = pool_row_format(pool)
        self._codec = {kind: KIND_FORMATS[kind].packed(self.row_format, cfg)
                       for kind in (GroupKind.SWA, GroupKind.KV, GroupKind.INDEX)}
        self.ratio = {o: cfg.compress_ratios[o] for o in cfg.kv_source_layer_ids}
        self._kv: dict[int, _Placement] = {}
        self._index: dict[int, _Placement] = {}
        self._check_and_index()

    # ---- placements --------------------------------------------------------------------------
    def _check_and_index(self) -> None:
        pool, cfg = self.pool, self.cfg
        for owner, ratio in self.ratio.items():
            k = list(pool.sources_by_ratio[ratio]).index(owner)
            kv = pool.kv_pools[ratio]
            if kv.page_size * ratio != PAGE_SIZE:
                raise PoolRowsError(f"kv.L{owner}: compressed pages of {kv.page_size} rows, expected {PAGE_SIZE // ratio}")
            codec = self._codec[GroupKind.KV]
            data, scales = codec.parts(cfg.head_dim)
            if (kv.kv_layout.data_bytes, kv.kv_layout.scale_bytes) != (data, scales):
                raise PoolRowsError(f"kv.L{owner}: SGLang's rows are {kv.kv_layout.data_bytes}+"
                                    f"{kv.kv_layout.scale_bytes} bytes, the model's {data}+{scales}")
            buf = kv.kv_buffer[k].view(torch.uint8)
            self._kv[owner] = _Placement(buf.view(-1), buf.shape[1], data, scales, codec, cfg.head_dim)
            codec = self._codec[GroupKind.INDEX]
            data, scales = codec.parts(cfg.index_head_dim)
            buf = pool.index_pools[ratio].index_k_with_scale_buffer[k].view(torch.uint8)
            self._index[owner] = _Placement(buf.view(-1), buf.shape[1], data, scales, codec, cfg.index_head_dim)
        swa = pool.swa_kv_pool
        data, scales = self._codec[GroupKind.SWA].parts(cfg.head_dim)
        if (swa.kv_layout.data_bytes, swa.kv_layout.scale_bytes) != (data, scales):
            raise PoolRowsError(f"swa: SGLang's rows are {swa.kv_layout.data_bytes}+{swa.kv_layout.scale_bytes} "
                                f"bytes, the model's {data}+{scales}")
        self._swa_parts = (data, scales)

    def _compressed_slots(self, owner: int, req: int, rows: torch.Tensor) -> torch.Tensor:
        ratio = self.ratio[owner]
        return self.req_to_token[req, rows * ratio].long() // ratio

    def _compressed_offsets(self, owner: int, kind: str, req: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._slot_offsets(owner, kind, self._compressed_slots(owner, req, rows))

    def _slot_offsets(self, owner: int, kind: str, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte offsets of the data and scales of compressed slots `loc` of owner's `kind` buffer."""
        ratio = self.ratio[owner]
        if kind == "kv":
            kv = self.pool.kv_pools[ratio]
            page, slot = loc // kv.page_size, loc % kv.page_size
            data_stride, scale_base, scale_stride = kv.kv_layout.row_addressing(kv.page_size)
            base = page * self._kv[owner].page_bytes
            return base + slot * data_stride, base + scale_base + slot * scale_stride
        index = self.pool.index_pools[ratio]
        place = self._index[owner]
        page, slot = loc // index.page_size, loc % index.page_size
        base = page * place.page_bytes
        return base + slot * place.data_bytes, base + index.page_size * place.data_bytes + slot * place.scale_bytes

    def _swa_slots(self, req: int, tokens: torch.Tensor) -> torch.Tensor:
        return self.pool.translate_loc_from_full_to_swa(self.req_to_token[req, tokens].long()).long()

    def _swa_offsets(self, layer: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        swa = self.pool.swa_kv_pool
        buf = swa.kv_buffer[layer].view(torch.uint8)
        page, slot = loc // swa.page_size, loc % swa.page_size
        data_stride, scale_base, scale_stride = swa.kv_layout.row_addressing(swa.page_size)
        base = page * buf.shape[1]
        return buf.view(-1), base + slot * data_stride, base + scale_base + slot * scale_stride

    @staticmethod
    def _gather(flat: torch.Tensor, data_off: torch.Tensor, scale_off: torch.Tensor, data: int, scales: int) -> torch.Tensor:
        d = flat[data_off.unsqueeze(1) + torch.arange(data)]
        s = flat[scale_off.unsqueeze(1) + torch.arange(scales)]
        return torch.cat((d, s), dim=1)

    @staticmethod
    def _scatter(flat: torch.Tensor, data_off: torch.Tensor, scale_off: torch.Tensor, packed: torch.Tensor,
                 data: int, scales: int) -> None:
        flat[data_off.unsqueeze(1) + torch.arange(data)] = packed[:, :data]
        flat[scale_off.unsqueeze(1) + torch.arange(scales)] = packed[:, data:data + scales]

    # ---- reads and writes --------------------------------------------------------------------
    def read_window(self, layer: int, req: int, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Layer's window rows of tokens [start, end) as model values."""
        if end <= start:
            return torch.empty(0, self.cfg.head_dim, dtype=dtype)
        data, scales = self._swa_parts
        flat, d_off, s_off = self._swa_offsets(layer, self._swa_slots(req, torch.arange(start, end)))
        packed = self._gather(flat, d_off, s_off, data, scales)
        return self._codec[GroupKind.SWA].unpack_rows(packed, self.cfg.head_dim).to(dtype)

    def write_window(self, layer: int, req: int, start: int, values: torch.Tensor) -> None:
        """Rows of tokens [start, start + len(values)); a token with no SWA slot is skipped (SGLang maps it to
        its dummy slot 0: a decode worker's tail-only SWA, below the rows a later query reads)."""
        loc = self._swa_slots(req, torch.arange(start, start + values.shape[0]))
        mapped = loc > 0
        if not bool(mapped.all()):
            loc, values = loc[mapped], values[mapped]
        if values.shape[0] == 0:
            return
        data, scales = self._swa_parts
        flat, d_off, s_off = self._swa_offsets(layer, loc)
        self._scatter(flat, d_off, s_off, self._codec[GroupKind.SWA].pack_rows(values.float()), data, scales)

    def read_compressed(self, kind: str, owner: int, req: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [0, end) of owner's compressed KV (`kind` 'kv') or index keys ('index')."""
        place = (self._kv if kind == "kv" else self._index)[owner]
        if end <= 0:
            return torch.empty(0, place.channels, dtype=dtype)
        d_off, s_off = self._compressed_offsets(owner, kind, req, torch.arange(end))
        packed = self._gather(place.buffer, d_off, s_off, place.data_bytes, place.scale_bytes)
        return place.fmt.unpack_rows(packed, place.channels).to(dtype)

    def write_compressed(self, kind: str, owner: int, req: int, first_row: int, values: torch.Tensor) -> None:
        rows = torch.arange(first_row, first_row + values.shape[0])
        self.write_compressed_slots(kind, owner, self._compressed_slots(owner, req, rows), values)

    def write_compressed_slots(self, kind: str, owner: int, loc: torch.Tensor, values: torch.Tensor) -> None:
        """Owner's compressed rows (`kind` 'kv') or index keys ('index') at SGLang's compressed slots `loc`
        (what its pool's stores take: slot req_to_token[r, j * ratio] // ratio of row j)."""
        if values.shape[0] == 0:
            return
        place = (self._kv if kind == "kv" else self._index)[owner]
        d_off, s_off = self._slot_offsets(owner, kind, loc.long())
        self._scatter(place.buffer, d_off, s_off, place.fmt.pack_rows(values.float()), place.data_bytes,
                      place.scale_bytes)

    def snapshot(self, req: int, num_tokens: int, swa_layers: Sequence[int] | None = None,
                 window_rows: int | None = None) -> dict[str, np.ndarray]:
        """The packed bytes of everything a request of `num_tokens` tokens holds that a later step reads:
        the window rows of the last `window_rows` positions (default W) of `swa_layers` (default: every
        layer), every compressed row and index key, and the pending token of each ratio-2 source (keyed
        by cache group name, as SGLang stores them)."""
        out: dict[str, np.ndarray] = {}
        data, scales = self._swa_parts
        first = max(0, num_tokens - (self.cfg.sliding_window if window_rows is None else window_rows))
        window_slots = self._swa_slots(req, torch.arange(first, num_tokens))
        for layer in range(self.cfg.num_hidden_layers) if swa_layers is None else swa_layers:
            flat, d_off, s_off = self._swa_offsets(layer, window_slots)
            out[f"swa.L{layer}"] = self._gather(flat, d_off, s_off, data, scales).numpy()
        for owner, ratio in self.ratio.items():
            rows = torch.arange(num_tokens // ratio)
            for kind, places in (("kv", self._kv), ("index", self._index)):
                place = places[owner]
                d_off, s_off = self._compressed_offsets(owner, kind, req, rows)
                out[f"{kind}.L{owner}"] = self._gather(place.buffer, d_off, s_off, place.data_bytes,
                                                       place.scale_bytes).numpy()
            if ratio == 2 and num_tokens % 2:
                out[f"tail.L{owner}"] = self._ring_row(owner, req, num_tokens - 1).view(torch.uint8).numpy().copy()
        return out

    def _ring_row(self, owner: int, req: int, token: int) -> torch.Tensor:
        ring = self.pool.compress_state_pools[owner]
        if ring is None or not ring.request_scoped or ring.ratio != 2:
            raise PoolRowsError(f"tail.L{owner}: layer {owner} has no ratio-2 pending-pair ring")
        return ring.kv_score_buffer.kv_score[req * ring.ring_size + token % ring.ring_size]

    def read_tail(self, owner: int, req: int, token: int) -> torch.Tensor:
        """The pending token's fp32 (value, gate) of a ratio-2 source, as [2, head_dim]."""
        return self._ring_row(owner, req, token).view(2, self.cfg.head_dim).clone()

    def write_tail(self, owner: int, req: int, token: int, value: torch.Tensor) -> None:
        self._ring_row(owner, req, token).copy_(value.float().reshape(-1))
