"""Host side of a whole-forward decode step: reserve cache rows, fill static inputs, commit after.

Checks and reserves every cache row the step writes, fills the decode graph's static inputs
(`decode_graph.INPUT_NAMES`), and after the replay commits the bookkeeping (row ends, window drop,
compressor tails and rollback journal, positions); or undoes the reservations when the step does
not run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..cache import RequestCache, index_group, kv_group, swa_group
from ..cache.paged import PagedRows
from ..cache.request import ROLLBACK_MARGIN_ROWS
from .batch import window_start
from .decode_graph import INPUT_NAMES, DecodeShape, kv_owners, ratio2_owners, window_keys
from .segments import SegmentProgram

PAD_TOKEN = 0  # padding rows embed a real token: their values stay finite and never reach real rows


@dataclass(frozen=True)
class DecodeRequest:
    cache: RequestCache
    tokens: torch.Tensor  # [n], n <= shape.width


def context_rows(program: SegmentProgram, end: int) -> int:
    """Compressed rows the largest KV source holds once a request reaches position `end`."""
    return max((end // b.info.ratio for b in program.blocks if b.info.owns_kv), default=0)


def flat_slots(rows: Sequence[PagedRows], logical: torch.Tensor) -> torch.Tensor:
    """Flat slot ids (into a pool's storage viewed as [pages * page_rows, ...]) of logical rows [K, X]
    in each of K PagedRows, one table lookup for all; rows outside a table's pages give garbage
    that the caller masks."""
    width = max((len(r.pages) for r in rows), default=0) or 1
    pages = torch.tensor([r.pages + [0] * (width - len(r.pages)) for r in rows], dtype=torch.long).view(len(rows), width)
    base = torch.tensor([r.base for r in rows], dtype=torch.long).view(-1, 1)
    page_rows = torch.tensor([r.pool.spec.page_rows for r in rows], dtype=torch.long).view(-1, 1)
    offset = logical - base
    page = (offset.div(page_rows, rounding_mode="floor")).clamp(0, width - 1)
    return pages.gather(1, page) * page_rows + offset.remainder(page_rows)


def _with_sink(write: torch.Tensor) -> torch.Tensor:
    """[K, N] slots, -1 where a row writes nothing -> those rows pointed at a sink: per row k the
    smallest slot no real row of k writes (one of 0..N is always free)."""
    n = write.shape[-1]
    candidates = torch.arange(n + 1)
    used = (write.unsqueeze(-1) == candidates).any(dim=-2)  # [K, N + 1]
    sink = (~used).to(torch.uint8).argmax(dim=-1, keepdim=True)  # the first free candidate
    return torch.where(write >= 0, write, sink)


class DecodeStep:
    """One step's reservations and static inputs. `prepare()` checks every request and reserves its
    rows (undoing them if any reservation fails); then either `commit(outputs)` or `abandon()`."""

    def __init__(self, program: SegmentProgram, requests: Sequence[DecodeRequest], shape: DecodeShape) -> None:
        if len(requests) > shape.batch:
            raise ValueError(f"{len(requests)} requests do not fit {shape.batch} slots")
        for r in requests:
            if not 1 <= r.tokens.numel() <= shape.width:
                raise ValueError(f"a decode request runs 1 to {shape.width} rows, got {r.tokens.numel()}")
        self.program, self.requests, self.shape = program, list(requests), shape
        self.cfg = program.model.cfg
        self.starts = [r.cache.pos for r in self.requests]
        self.lengths = [r.tokens.numel() for r in self.requests]
        self._reserved: list[tuple[PagedRows, int]] = []
        self._tails: dict[int, list[torch.Tensor | None]] = {}
        self._need: list[list[int]] = []  # [layer][request] first window key read

    # ---- before the replay ---------------------------------------------------------------------
    def _check(self) -> None:
        cfg = self.cfg
        self._need = [[0] * len(self.requests) for _ in self.program.blocks]
        for b, (r, p0, n) in enumerate(zip(self.requests, self.starts, self.lengths)):
            cache = r.cache
            for li, block in enumerate(self.program.blocks):
                info = block.info
                rows = cache.rows(swa_group(info.index))
                if rows.end != p0:
                    raise RuntimeError(f"layer {info.index}: window rows end at {rows.end}, request {b} is at {p0}")
                self._need[li][b] = window_start(cfg, info.index, p0, cache.swa_floor.get(info.index, 0), rows)
                if info.owns_kv:
                    kv = cache.rows(kv_group(info.index))
                    if kv.start != 0 or kv.end != p0 // info.ratio:
                        raise RuntimeError(f"layer {info.index}: compressed rows [{kv.start}, {kv.end}) stored, "
                                           f"position {p0} needs [0, {p0 // info.ratio})")
                    if info.ratio > 1 and (cache.tail(info.index) is not None) != bool(p0 % 2):
                        raise RuntimeError(f"layer {info.index}: request {b} at position {p0} "
                                           f"{'lacks' if p0 % 2 else 'holds'} a compressor tail")
            most = context_rows(self.program, p0 + n)
            if most > self.shape.context:
                raise ValueError(f"request {b} reaches {most} compressed rows, the shape holds {self.shape.context}")

    def _reserve(self, rows: PagedRows, n: int) -> None:
        self._reserved.append((rows, rows.end))
        rows.reserve(n)

    def prepare(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Check, reserve and return the static inputs (in `INPUT_NAMES` order) on `device`."""
        self._check()
        try:
            t = self._fill()
        except BaseException:
            self.abandon()
            raise
        return tuple(t[name].to(device) for name in INPUT_NAMES)

    def _fill(self) -> dict[str, torch.Tensor]:
        cfg, shape = self.cfg, self.shape
        B, W = shape.batch, shape.width
        R, L = len(self.requests), len(self.program.blocks)
        S = window_keys(cfg.sliding_window, W)
        p0 = torch.tensor(self.starts, dtype=torch.long)
        n = torch.tensor(self.lengths, dtype=torch.long)
        rows_of = torch.arange(W)
        row_pos = p0.unsqueeze(1) + rows_of  # [R, W]
        row_valid = rows_of < n.unsqueeze(1)
        t: dict[str, torch.Tensor] = {
            "tokens": torch.full((B, W), PAD_TOKEN, dtype=torch.long),
            "positions": torch.zeros(B, W, dtype=torch.long),
            "valid": torch.zeros(B, W, dtype=torch.bool),
        }
        for b, r in enumerate(self.requests):
            t["tokens"][b, : self.lengths[b]] = r.tokens.to("cpu", torch.long)
        t["positions"][:R] = torch.where(row_valid, row_pos, 0)
        t["valid"][:R] = row_valid
        for name in ("tokens", "positions", "valid"):
            t[name] = t[name].flatten()

        # window: every layer's rows of every request, one table lookup
        window = [r.cache.rows(swa_group(block.info.index)) for block in self.program.blocks for r in self.requests]
        for k, rows in enumerate(window):
            self._reserve(rows, self.lengths[k % R] if R else 0)
        keys = (p0 - cfg.sliding_window + 1).unsqueeze(1) + torch.arange(S)  # [R, S]: key j's position
        need = torch.tensor(self._need, dtype=torch.long).view(L, R, 1)
        held = (keys >= need) & (keys < (p0 + n).view(1, R, 1))  # [L, R, S]
        slots = flat_slots(window, keys.expand(L, R, S).reshape(L * R, S)).view(L, R, S)
        t["win_slots"] = torch.zeros(L, B, S, dtype=torch.long)
        t["win_kpos"] = torch.full((L, B, S), -1, dtype=torch.long)
        t["win_slots"][:, :R] = torch.where(held, slots, 0)
        t["win_kpos"][:, :R] = torch.where(held, keys.expand(L, R, S), -1)
        t["win_floor"] = torch.zeros(L, B, dtype=torch.long)
        t["win_floor"][:, :R] = torch.tensor([[r.cache.swa_floor.get(block.info.index, 0) for r in self.requests]
                                              for block in self.program.blocks], dtype=torch.long).view(L, R)
        write = torch.full((L, B, W), -1, dtype=torch.long)
        written = flat_slots(window, row_pos.expand(L, R, W).reshape(L * R, W)).view(L, R, W)
        write[:, :R] = torch.where(row_valid, written, -1)
        t["win_write"] = _with_sink(write.view(L, B * W))
        self._fill_owners(t, row_pos, row_valid)
        return t

    def _fill_owners(self, t: dict, row_pos: torch.Tensor, row_valid: torch.Tensor) -> None:
        B, W, C = self.shape.batch, self.shape.width, self.shape.context
        R = len(self.requests)
        owners = kv_owners(self.program)
        ratio_of = {b.info.index: b.info.ratio for b in self.program.blocks}
        O = len(owners)
        ratios = torch.tensor([ratio_of[o] for o in owners], dtype=torch.long).view(O, 1, 1)
        # a row at position p completes compressed row (p + 1) / ratio - 1 when (p + 1) % ratio == 0
        done = row_valid & ((row_pos + 1) % ratios == 0)  # [O, R, W]
        row_ids = (row_pos + 1).div(ratios, rounding_mode="floor") - 1
        ends = (torch.tensor(self.starts) + torch.tensor(self.lengths, dtype=torch.long)).view(1, R, 1)
        ends = ends.div(ratios, rounding_mode="floor")  # [O, R, 1] rows held after the step
        t["done"] = torch.zeros(O, B, W, dtype=torch.bool)
        t["done"][:, :R] = done
        t["done"] = t["done"].view(O, B * W)
        for kind, group in (("kv", kv_group), ("idx", index_group)):
            rows = [r.cache.rows(group(o)) for o in owners for r in self.requests]
            for k, rr in enumerate(rows):
                self._reserve(rr, int(ends.view(-1)[k]) - rr.end)
            reads = torch.zeros(O, B, C, dtype=torch.long)
            ids = torch.arange(C).expand(O * R, C)
            found = flat_slots(rows, ids).view(O, R, C)
            reads[:, :R] = torch.where(torch.arange(C) < ends, found, 0)
            write = torch.full((O, B, W), -1, dtype=torch.long)
            write[:, :R] = torch.where(done, flat_slots(rows, row_ids.reshape(O * R, W)).view(O, R, W), -1)
            t[f"{kind}_read"], t[f"{kind}_write"] = reads, _with_sink(write.view(O, B * W))
        owners2 = ratio2_owners(self.program)
        t["tail"] = torch.zeros(len(owners2), B, 2, self.cfg.head_dim, dtype=torch.float32)
        for j, o in enumerate(owners2):
            held = [r.cache.tail(o) for r in self.requests]
            self._tails[o] = [None if h is None else h.clone() for h in held]
            for b, h in enumerate(held):
                if h is not None:
                    t["tail"][j, b] = h

    # ---- after the replay ----------------------------------------------------------------------
    def commit(self, outputs: tuple[torch.Tensor, ...], first_extra: int) -> None:
        """Advance every request past its rows: `outputs[first_extra:]` are the ratio-2 owners'
        (values, gates) [N, head_dim] in `ratio2_owners` order."""
        cfg, W = self.cfg, self.shape.width
        extra = outputs[first_extra:]
        pairs = {o: (extra[2 * j], extra[2 * j + 1]) for j, o in enumerate(ratio2_owners(self.program))}
        for b, (r, p0, n) in enumerate(zip(self.requests, self.starts, self.lengths)):
            cache = r.cache
            last = p0 + n - 1
            for block in self.program.blocks:
                info = block.info
                rows = cache.rows(swa_group(info.index))
                rows.advance(n)
                rows.drop_before(last + 2 - cfg.sliding_window - ROLLBACK_MARGIN_ROWS)
                if info.owns_kv:
                    added = (p0 + n) // info.ratio - p0 // info.ratio
                    cache.rows(kv_group(info.index)).advance(added)
                    cache.rows(index_group(info.index)).advance(added)
            for owner, (v, g) in pairs.items():
                v, g = v[b * W : b * W + n], g[b * W : b * W + n]
                held = self._tails[owner][b]
                if held is not None:  # the journal holds the tail token's inputs too, as pair_up keeps them
                    v, g = torch.cat((held[0:1], v)), torch.cat((held[1:2], g))
                cache.record_pair_inputs(owner, p0 - (held is not None), v, g)
                cache.set_tail(owner, torch.stack((v[-1], g[-1])) if (p0 + n) % 2 else None)
            cache.pos = p0 + n
        self._reserved.clear()

    def abandon(self) -> None:
        """Free every reservation (rows never advanced, so the caches are as before the step)."""
        for rows, end in reversed(self._reserved):
            rows.truncate(end)
        self._reserved.clear()
