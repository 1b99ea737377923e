"""One layer's attention over a batch of token chunks, reading and extending each request's caches.

A query at position p attends its own layer's window keys k in [max(floor, p - W + 1), p] and, on
compressed layers, the rows of its KV source that the latest index selection picked for it; one
softmax over both plus a per-head sink logit that only enters the denominator. K = V (one latent
head); the output is un-roped, projected per group by wo_a, then by wo_b. Projections, RoPE and cache
quantization run over all rows of a batch at once; window, compressed rows, index selection and the
softmax run per request (Segment) on its own cache."""

from __future__ import annotations

import torch
from torch import nn

from ..cache import RequestCache, index_group, kv_group, swa_group
from ..cache.request import ROLLBACK_MARGIN_ROWS
from ..config import V41Config
from ..layer_plan import LayerInfo, Role
from .batch import ChunkState, RowBatch, Segment, window_start
from .compressor import Compressor, write_compressed_rows
from .indexer import Indexer
from .primitives import RMSNorm, RopeTable, apply_rope, grouped_linear
from .quant import Quantizer

QUERY_TILE = 256  # queries per attention/indexer tile: bounds the [tile, heads, keys] temporaries
# Segments of at most this many rows (decode and verify steps, 1 + k <= 8) with the same row count are
# attended together in one softmax over padded keys; other segments are attended on their own.
SMALL_SEGMENT_ROWS = 8


class LatentProjections(nn.Module):
    """The query, KV and output projections and per-head sink logits around one latent KV head, named as
    the released tensors name them: a layer's attention and a draft block's have the same."""

    def __init__(self, cfg: V41Config, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        heads, hd = cfg.num_attention_heads, cfg.head_dim
        self.wq_a = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, dtype)
        self.wq_b = nn.Linear(cfg.q_lora_rank, heads * hd, bias=False, dtype=dtype)
        self.wkv = nn.Linear(cfg.hidden_size, hd, bias=False, dtype=dtype)
        self.kv_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype)
        self.wo_a = nn.Linear(heads * hd // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, bias=False, dtype=dtype)
        self.wo_b = nn.Linear(cfg.o_groups * cfg.o_lora_rank, cfg.hidden_size, bias=False, dtype=dtype)
        self.attn_sink = nn.Parameter(torch.zeros(heads, dtype=torch.float32), requires_grad=False)


class Attention(LatentProjections):
    def __init__(self, cfg: V41Config, info: LayerInfo, dtype: torch.dtype) -> None:
        super().__init__(cfg, dtype)
        self.info = info
        if info.owns_kv:
            self.compressor = Compressor(cfg, info.ratio, dtype)
        if info.has_indexer:
            self.indexer = Indexer(cfg, dtype, owns_keys=info.owns_kv)
        self.rope = RopeTable(cfg, compressed=info.ratio > 0)

    def forward(self, x: torch.Tensor, batch: RowBatch, quant: Quantizer) -> torch.Tensor:
        cfg, info = self.cfg, self.info
        angles = self.rope.angles(batch.positions)
        q_latent = self.q_norm(self.wq_a(x))
        q = apply_rope(self.wq_b(q_latent).unflatten(-1, (cfg.num_attention_heads, cfg.head_dim)), angles)
        kv = quant.swa_kv(apply_rope(self.kv_norm(self.wkv(x)), angles))
        index_queries = None
        if info.ratio:
            if info.owns_kv:
                write_compressed_rows(self.compressor, self.indexer, self.rope, quant, x, batch, info.index)
            if info.has_indexer:
                index_queries = self.indexer.queries(x, q_latent, angles, quant)
        segments = batch.segments
        views = [self._extend(seg, kv[seg.rows],
                              None if index_queries is None else tuple(t[seg.rows] for t in index_queries))
                 for seg in segments]
        parts: list[torch.Tensor | None] = [None] * len(segments)
        same_rows: dict[int, list[int]] = {}  # short segments by row count: decode (1), verify (1 + k)
        for i, seg in enumerate(segments):
            if seg.rows.stop - seg.rows.start <= SMALL_SEGMENT_ROWS:
                same_rows.setdefault(seg.rows.stop - seg.rows.start, []).append(i)
        for group in same_rows.values():
            if len(group) > 1:  # several requests' decode / verify rows: one softmax, keys padded
                for i, out in zip(group, self._attend_padded([(q[segments[i].rows], segments[i], *views[i])
                                                              for i in group])):
                    parts[i] = out
        for i, (seg, (window_rows, compressed)) in enumerate(zip(segments, views)):
            if parts[i] is None:
                pos, sel, qs = seg.state.positions, seg.state.selection, q[seg.rows]
                tiles = [self._attend(qs[a : a + QUERY_TILE], pos[a : a + QUERY_TILE], window_rows, compressed,
                                      None if compressed is None else sel[a : a + QUERY_TILE], seg.cache)
                         for a in range(0, qs.shape[0], QUERY_TILE)]
                parts[i] = tiles[0] if len(tiles) == 1 else torch.cat(tiles)
        for seg, (window_rows, _) in zip(segments, views):
            # Only the last window stays (the next chunk's first query needs keys from p - W + 1 on), plus
            # a margin for rolling back a rejected speculative suffix.
            last = seg.start + seg.rows.stop - seg.rows.start - 1
            window_rows.drop_before(last + 2 - cfg.sliding_window - ROLLBACK_MARGIN_ROWS)
        attended = parts[0] if len(parts) == 1 else torch.cat(parts)
        attended = apply_rope(attended, angles, inverse=True)
        grouped = grouped_linear(attended.reshape(x.shape[0], cfg.o_groups, -1), self.wo_a.weight, cfg.o_groups)
        return self.wo_b(grouped.flatten(1))

    def _extend(self, seg: Segment, kv: torch.Tensor, index_queries):
        """One request's cache work: append its window rows, read its compressed rows, pick its selection.
        Returns (its window rows, its compressed rows or None)."""
        info, cache, state = self.info, seg.cache, seg.state
        window_rows = cache.rows(swa_group(info.index))
        if window_rows.end != seg.start:
            raise RuntimeError(f"layer {info.index}: window rows end at {window_rows.end}, chunk starts at {seg.start}")
        window_rows.append(kv)
        compressed = None
        if info.ratio:
            compressed = cache.rows(kv_group(info.kv_source)).read()
            if info.has_indexer:
                self._index(index_queries, state, cache)
            if state.selection is None:
                raise RuntimeError(f"layer {info.index} reuses a selection but no index source ran before it")
        return window_rows, compressed

    def _index(self, index_queries, state: ChunkState, cache: RequestCache) -> None:
        info, cfg = self.info, self.cfg
        q, w = index_queries
        keys = cache.rows(index_group(info.kv_source)).read()
        visible = (state.positions + 1) // info.ratio
        selections, candidates = [], []
        for a in range(0, q.shape[0], QUERY_TILE):
            b = a + QUERY_TILE
            scores = self.indexer.scores(q[a:b], w[a:b], keys, visible[a:b])
            if info.role is Role.FULL_CANDIDATE:
                candidates.append(self.indexer.candidate_blocks(scores, visible[a:b]))
            elif info.index > cfg.candidate_source_layer_id:
                if state.candidates is None:
                    raise RuntimeError(f"reindex layer {info.index} needs candidates from layer {cfg.candidate_source_layer_id}")
                scores = scores.masked_fill(~state.candidates[a:b], -torch.inf)
            selections.append(self.indexer.select(scores))
        state.selection = torch.cat(selections)
        if candidates:
            state.candidates = torch.cat(candidates)

    def _attend(self, q: torch.Tensor, pos: torch.Tensor, window_rows, compressed, selection,
                cache: RequestCache) -> torch.Tensor:
        cfg, layer = self.cfg, self.info.index
        first, last = int(pos[0]), int(pos[-1])
        floor = cache.swa_floor.get(layer, 0)
        need = window_start(cfg, layer, first, floor, window_rows)
        keys = window_rows.read(need, last + 1)
        key_pos = torch.arange(need, last + 1, device=q.device)
        low = torch.clamp(pos - cfg.sliding_window + 1, min=floor)
        allowed = (key_pos >= low.unsqueeze(1)) & (key_pos <= pos.unsqueeze(1))
        scale = cfg.head_dim ** -0.5
        qf = q.float()
        parts = [torch.einsum("thd,sd->ths", qf, keys.float()).mul(scale)
                 .masked_fill(~allowed.unsqueeze(1), -torch.inf)]
        if compressed is not None:
            picked = compressed[selection.clamp(min=0)].float() if selection.shape[-1] else \
                compressed.new_zeros(q.shape[0], 0, cfg.head_dim).float()
            parts.append(torch.einsum("thd,tkd->thk", qf, picked).mul(scale)
                         .masked_fill((selection < 0).unsqueeze(1), -torch.inf))
        parts.append(self.attn_sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1))
        probs = torch.cat(parts, dim=-1).softmax(dim=-1)
        n_keys = keys.shape[0]
        out = torch.einsum("ths,sd->thd", probs[..., :n_keys], keys.float())
        if compressed is not None:
            out = out + torch.einsum("thk,tkd->thd", probs[..., n_keys:-1], picked)
        return out.to(q.dtype)

    def _attend_padded(self, items) -> list[torch.Tensor]:
        """_attend for several short segments at once: (q [T_i, H, d], segment, window rows, compressed
        rows) each; keys, compressed picks and masks are padded to the longest, padding never attends."""
        cfg, layer = self.cfg, self.info.index
        pad = nn.utils.rnn.pad_sequence
        queries, positions, lows, keys, key_positions, picks, selections = [], [], [], [], [], [], []
        for q, seg, window_rows, compressed in items:
            pos, cache = seg.state.positions, seg.cache
            first, last = int(pos[0]), int(pos[-1])
            floor = cache.swa_floor.get(layer, 0)
            need = window_start(cfg, layer, first, floor, window_rows)
            queries.append(q)
            positions.append(pos)
            lows.append(torch.clamp(pos - cfg.sliding_window + 1, min=floor))
            keys.append(window_rows.read(need, last + 1))
            key_positions.append(torch.arange(need, last + 1, device=q.device))
            if compressed is not None:
                selection = seg.state.selection
                picks.append(compressed[selection.clamp(min=0)] if selection.shape[-1] else
                             compressed.new_zeros(q.shape[0], 0, cfg.head_dim))
                selections.append(selection)
        scale = cfg.head_dim ** -0.5
        qf = pad(queries, batch_first=True).float()  # [n, T, H, d]
        pos = pad(positions, batch_first=True, padding_value=-1)  # padded queries see no key
        low = pad(lows, batch_first=True)
        k = pad(keys, batch_first=True).float()  # [n, S, d]
        key_pos = pad(key_positions, batch_first=True, padding_value=-1)  # padded keys are never allowed
        allowed = (key_pos.unsqueeze(1) >= low.unsqueeze(2)) & (key_pos.unsqueeze(1) <= pos.unsqueeze(2))
        parts = [torch.einsum("nthd,nsd->nths", qf, k).mul(scale).masked_fill(~allowed.unsqueeze(2), -torch.inf)]
        if picks:
            width = max(p.shape[1] for p in picks)
            c = pad([nn.functional.pad(p, (0, 0, 0, width - p.shape[1])) for p in picks], batch_first=True).float()
            sel = pad([nn.functional.pad(s, (0, width - s.shape[1]), value=-1) for s in selections],
                      batch_first=True, padding_value=-1)
            parts.append(torch.einsum("nthd,ntkd->nthk", qf, c).mul(scale)
                         .masked_fill((sel < 0).unsqueeze(2), -torch.inf))
        parts.append(self.attn_sink.float().view(1, 1, -1, 1).expand(qf.shape[0], qf.shape[1], -1, 1))
        probs = torch.cat(parts, dim=-1).softmax(dim=-1)
        n_keys = k.shape[1]
        out = torch.einsum("nths,nsd->nthd", probs[..., :n_keys], k)
        if picks:
            out = out + torch.einsum("nthk,ntkd->nthd", probs[..., n_keys:-1], c)
        out = out.to(queries[0].dtype)
        return [out[i, : q.shape[0]] for i, q in enumerate(queries)]
