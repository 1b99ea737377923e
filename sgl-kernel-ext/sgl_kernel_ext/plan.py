"""Copy plans: the (source byte, destination byte, length) segments of a gather or scatter, built
once per request (or batch of requests) on the host and checked before anything is written.

A gather lays a request's groups back to back in a contiguous extent, in wire order: group g at
the sum of the earlier groups' bytes, row r of it at r * row_bytes, its parts one after another.
A scatter is the same plan with source and destination swapped. Segments address flat byte
offsets of buffers listed once per side; the executors (reference.py, triton_copy.py) copy them.

Checked here, on every plan: all buffers on one device, every segment inside its buffer, no two
destination bytes the same, and no destination byte that is also a source byte (by address, so
aliasing views count; segment by segment only where a destination buffer shares addresses with a
source buffer). Destinations already in address order (a gather's extent) skip the sort.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .sites import KernelInputError, RowSites


def _flat(buffer: torch.Tensor, what: str) -> torch.Tensor:
    if buffer.dtype != torch.uint8 or not buffer.is_contiguous():
        raise KernelInputError(f"{what}: needs a contiguous uint8 tensor, got {buffer.dtype} "
                               f"contiguous={buffer.is_contiguous()}")
    return buffer.reshape(-1)


@dataclass(frozen=True, eq=False)
class CopyPlan:
    """Segment i copies length[i] bytes from src_buffers[src_buf[i]] at src_off[i] to
    dst_buffers[dst_buf[i]] at dst_off[i] (flat byte offsets)."""

    src_buffers: tuple[torch.Tensor, ...]
    dst_buffers: tuple[torch.Tensor, ...]
    src_buf: torch.Tensor   # int64 [n]
    src_off: torch.Tensor   # int64 [n]
    dst_buf: torch.Tensor   # int64 [n]
    dst_off: torch.Tensor   # int64 [n]
    length: torch.Tensor    # int64 [n]
    cache: dict = field(default_factory=dict, repr=False)  # executors' derived tables (built once)

    def __post_init__(self) -> None:
        object.__setattr__(self, "src_buffers", tuple(_flat(b, "source buffer") for b in self.src_buffers))
        object.__setattr__(self, "dst_buffers", tuple(_flat(b, "destination buffer") for b in self.dst_buffers))
        self._check()

    @property
    def num_segments(self) -> int:
        return int(self.length.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.length.sum()) if self.num_segments else 0

    @property
    def device(self) -> torch.device:
        return self.length.device

    # ---- checks -----------------------------------------------------------------------------
    def _check(self) -> None:
        n = self.num_segments
        fields = (self.src_buf, self.src_off, self.dst_buf, self.dst_off, self.length)
        if any(t.dtype != torch.int64 or t.shape != (n,) for t in fields):
            raise KernelInputError("segment tables must be int64 vectors of one length")
        devices = {t.device for t in fields} | {b.device for b in self.src_buffers + self.dst_buffers}
        if len(devices) > 1:
            raise KernelInputError(f"a plan's buffers and tables must share one device, got {sorted(map(str, devices))}")
        if n == 0:
            return
        if int(self.length.min()) < 1:
            raise KernelInputError("every segment must copy at least one byte")
        src_start, src_end = self._absolute(self.src_buffers, self.src_buf, self.src_off, "source")
        dst_start, dst_end = self._absolute(self.dst_buffers, self.dst_buf, self.dst_off, "destination")
        if bool((dst_start[1:] >= dst_start[:-1]).all()):   # already in address order (a gather's extent)
            s, e = dst_start, dst_end
        else:
            order = torch.argsort(dst_start)
            s, e = dst_start[order], dst_end[order]
        clash = torch.nonzero(s[1:] < e[:-1])
        if clash.numel():
            i = int(clash[0])
            raise KernelInputError(f"destination segments overlap: [{int(s[i])}, {int(e[i])}) and "
                                   f"[{int(s[i + 1])}, {int(e[i + 1])}) (absolute addresses); two rows or "
                                   f"extents would land on the same bytes")
        if not self._buffers_may_overlap():
            return
        # source union, then any destination segment that starts inside it or covers a start of it
        order = torch.argsort(src_start)
        ss, se = src_start[order], torch.cummax(src_end[order], 0).values
        k = torch.searchsorted(ss, e, right=False)  # sources starting before each destination's end
        reach = torch.where(k > 0, se[(k - 1).clamp(min=0)], torch.zeros_like(k))
        hit = torch.nonzero(reach > s)
        if hit.numel():
            i = int(hit[0])
            raise KernelInputError(f"destination segment [{int(s[i])}, {int(e[i])}) overlaps the plan's source bytes "
                                   f"(absolute addresses): the copy would read what it writes")

    def _buffers_may_overlap(self) -> bool:
        """Whether any destination buffer shares an address with any source buffer (else no segment can)."""
        spans = lambda bufs: [(b.data_ptr(), b.data_ptr() + b.numel()) for b in bufs]  # noqa: E731
        return any(s0 < d1 and d0 < s1 for s0, s1 in spans(self.src_buffers) for d0, d1 in spans(self.dst_buffers))

    def _absolute(self, buffers: tuple[torch.Tensor, ...], which: torch.Tensor, off: torch.Tensor, side: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Absolute [start, end) addresses of one side's segments, after checking each fits its buffer."""
        if int(which.min()) < 0 or int(which.max()) >= len(buffers):
            raise KernelInputError(f"{side} buffer index out of range ({len(buffers)} buffers)")
        dev = off.device
        sizes = torch.tensor([b.numel() for b in buffers], dtype=torch.int64, device=dev)
        bases = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=dev)
        end = off + self.length
        bad = torch.nonzero((off < 0) | (end > sizes[which]))
        if bad.numel():
            i = int(bad[0])
            raise KernelInputError(f"{side} segment {i} [{int(off[i])}, {int(end[i])}) does not fit its "
                                   f"{int(sizes[which[i]])}-byte buffer")
        return bases[which] + off, bases[which] + end

    # ---- building ---------------------------------------------------------------------------
    def swapped(self) -> "CopyPlan":
        """The reverse copy (a gather's scatter, and back)."""
        return CopyPlan(self.dst_buffers, self.src_buffers, self.dst_buf, self.dst_off, self.src_buf,
                        self.src_off, self.length)

    @classmethod
    def concat(cls, plans: Sequence["CopyPlan"]) -> "CopyPlan":
        """One plan doing all of `plans` (several requests in one launch); checked as a whole, so
        extents or rows of different requests that overlap are refused."""
        if not plans:
            raise KernelInputError("concat needs at least one plan")
        tables = {}
        for side in ("src", "dst"):
            buffers: list[torch.Tensor] = []
            index: dict[tuple[int, int], int] = {}
            which = []
            for p in plans:
                remap = []
                for b in getattr(p, f"{side}_buffers"):
                    key = (b.data_ptr(), b.numel())
                    if key not in index:
                        index[key] = len(buffers)
                        buffers.append(b)
                    remap.append(index[key])
                remap_t = torch.tensor(remap or [0], dtype=torch.int64, device=p.device)
                which.append(remap_t[getattr(p, f"{side}_buf")])
            tables[side] = (tuple(buffers), torch.cat(which), torch.cat([getattr(p, f"{side}_off") for p in plans]))
        return cls(tables["src"][0], tables["dst"][0], tables["src"][1], tables["src"][2], tables["dst"][1],
                   tables["dst"][2], torch.cat([p.length for p in plans]))


def _site_segments(sites: Sequence[RowSites], buffers: list[torch.Tensor], index: dict[tuple[int, int], int],
                   extent_at: int, device: torch.device) -> tuple[list[torch.Tensor], ...]:
    """Segments of groups laid back to back from `extent_at`: (site buffer index, site byte offset,
    extent byte offset, length), one per row part, in wire order."""
    bufs, offs, ext, lens = [], [], [], []
    at = extent_at
    for g in sites:
        if g.buffer.device != device:
            raise KernelInputError(f"{g.name}: its buffer is on {g.buffer.device}, the extent on {device}")
        key = (g.buffer.data_ptr(), g.buffer.numel())
        if key not in index:
            index[key] = len(buffers)
            buffers.append(g.buffer)
        n, page_bytes = g.num_rows, g.buffer.shape[1]
        if n:
            lengths = torch.tensor(g.lengths, dtype=torch.int64, device=device)
            prefix = torch.cumsum(lengths, 0) - lengths
            site = g.pages[:, None] * page_bytes + g.offsets                        # [rows, parts]
            wire = at + torch.arange(n, dtype=torch.int64, device=device)[:, None] * g.row_bytes + prefix[None, :]
            offs.append(site.reshape(-1))
            ext.append(wire.reshape(-1))
            lens.append(lengths.repeat(n))
            bufs.append(torch.full((n * len(g.lengths),), index[key], dtype=torch.int64, device=device))
        at += g.nbytes
    return bufs, offs, ext, lens


def payload_bytes(sites: Sequence[RowSites]) -> int:
    return sum(g.nbytes for g in sites)


def gather_plan(sites: Sequence[RowSites], extent: torch.Tensor, offset: int = 0) -> CopyPlan:
    """Copy the groups' rows into `extent` (contiguous uint8) from byte `offset`, back to back in
    wire order. Raises before anything is written if the payload does not fit the extent."""
    extent = _flat(extent, "extent")
    total = payload_bytes(sites)
    if offset < 0 or offset + total > extent.numel():
        raise KernelInputError(f"the {total}-byte payload does not fit the {extent.numel()}-byte extent "
                               f"at offset {offset}")
    buffers: list[torch.Tensor] = []
    bufs, offs, ext, lens = _site_segments(sites, buffers, {}, offset, extent.device)
    empty = torch.zeros(0, dtype=torch.int64, device=extent.device)
    cat = (lambda parts: torch.cat(parts) if parts else empty)
    ext_all = cat(ext)
    return CopyPlan(tuple(buffers), (extent,), cat(bufs), cat(offs), torch.zeros_like(ext_all), ext_all, cat(lens))


def scatter_plan(extent: torch.Tensor, sites: Sequence[RowSites], offset: int = 0) -> CopyPlan:
    """Copy a payload laid out as `gather_plan` lays it (from byte `offset` of `extent`) into the
    groups' row sites. Raises before anything is written if two rows share a site."""
    return gather_plan(sites, extent, offset).swapped()
