"""P's side of staged transfers (extents.py says why): a room's staging extent, the copy of
rows into it as send_rows hands them over, and cutting the wire entries for the lanes; and D's
copy of landed rows into pool slots.

The row copies (P's gather into the extent, D's scatter out of it) run on one of three paths,
chosen per extent by `copy` or $SGLANG_ASYM_STAGING_COPY:
  auto    sgl_kernel_ext's Triton kernel for CUDA pools; numpy's row copy for CPU pools
  numpy   numpy's row copy (CPU pools)
  torch   sgl_kernel_ext's torch reference
  triton  sgl_kernel_ext's Triton kernel (compiled on CUDA, Triton's interpreter on CPU: slow, for tests)
On CPU numpy stays the default: a 3.5 MB room took 0.9 ms through numpy and 9 ms through
sgl_kernel_ext's torch reference on one thread (mostly building and checking a plan per range; with
torch's 2 intra-op threads contending with the transport's, 118 ms), benchmark/results/kernels_staging.json.

A staged room's rows keep their place in the extent until the room is dropped (terminal and no
write task left), so a write never waits for a copy. A failed write can leave entries in flight
that read the extent after it was handed to another room: they can only land in the failed
room's destination, which D quarantines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.extents import BLOCK, ExtentBuffer, group_offsets
from sglang_asym.transfer.row_pool import RowPool

# Mooncake's TCP transport moves a request on one of MC_TCP_LANES_PER_PEER lanes (4 by default),
# its 64 KiB chunks one after another: a large write cut into that many pieces keeps every lane
# busy, while each extra entry of a small one costs more than it saves (measured on 2 cores, whole
# transfers: 342 KB as 1 entry 0.78 ms, as 4 entries 0.95 ms; 1.7 MB as 4 entries 1.39 ms, as 1 1.54 ms).
WRITE_PIECES = 4
MIN_PIECE_BYTES = 512 << 10

COPY_ENV = "SGLANG_ASYM_STAGING_COPY"
COPY_MODES = ("auto", "numpy", "torch", "triton")


def copy_mode(value: str | None = None) -> str:
    """`value`, else $SGLANG_ASYM_STAGING_COPY, else "auto" (checked against COPY_MODES)."""
    mode = value if value is not None else os.environ.get(COPY_ENV, "auto") or "auto"
    if mode not in COPY_MODES:
        raise ValueError(f"staging copy mode {mode!r} (from {'the caller' if value is not None else COPY_ENV}) "
                         f"is not one of {COPY_MODES}")
    return mode


def _path(mode: str, device: torch.device) -> str:
    if mode == "auto":
        return "triton" if device.type == "cuda" else "numpy"
    return mode


def _row_sites(name: str, table: torch.Tensor, slots: np.ndarray):
    from sgl_kernel_ext import PageLayout, RowSites
    return RowSites.paged(name, table, PageLayout.rows(int(table.shape[1])), torch.from_numpy(slots).to(table.device))


def _check_slots(slots: np.ndarray, table: torch.Tensor, name: str) -> None:
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= table.shape[0]):
        raise ValueError(f"{name}: slot out of range for a table of {int(table.shape[0])} rows")


def gather_rows(table: torch.Tensor, slots: np.ndarray, out: torch.Tensor, offset: int, mode: str | None = None,
                name: str = "rows") -> None:
    """Copy rows `slots` of `table` ([slots, row_bytes] uint8) into `out` (contiguous uint8) back to
    back from byte `offset`, on the path `mode` names (None: $SGLANG_ASYM_STAGING_COPY or auto)."""
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    path = _path(copy_mode(mode), table.device)
    if path == "numpy":
        rb = int(table.shape[1])
        if offset < 0 or offset + len(slots) * rb > out.numel():
            raise ValueError(f"{name}: {len(slots)} rows of {rb} bytes do not fit {out.numel()} bytes at {offset}")
        _check_slots(slots, table, name)
        np.take(table.numpy(), slots, axis=0, out=out.reshape(-1)[offset:offset + len(slots) * rb].numpy()
                .reshape(len(slots), rb))
        return
    from sgl_kernel_ext import gather
    gather([_row_sites(name, table, slots)], out, offset, backend=path)


def scatter_rows(rows: np.ndarray | torch.Tensor, table: torch.Tensor, slots: np.ndarray, mode: str | None = None,
                 name: str = "rows") -> None:
    """Copy `rows` ((n, row_bytes) uint8, e.g. Receiver.rows(group) of a staged room) into rows `slots`
    of `table`, on the path `mode` names (None: $SGLANG_ASYM_STAGING_COPY or auto)."""
    rows = torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape != (len(slots), table.shape[1]):
        raise ValueError(f"{name}: {tuple(rows.shape)} {rows.dtype} rows do not fit {len(slots)} slots of "
                         f"{int(table.shape[1])} bytes")
    path = _path(copy_mode(mode), table.device)
    if path == "numpy":
        _check_slots(slots, table, name)
        table.numpy()[slots] = rows.numpy()
        return
    from sgl_kernel_ext import scatter
    scatter(rows.contiguous(), [_row_sites(name, table, slots)], 0, backend=path)


@dataclass(frozen=True)
class StagingExtent:
    """Where a room's rows sit in P's staging buffer: group g's row r at address(g) + r * row_bytes."""

    buffer: ExtentBuffer
    blocks: np.ndarray
    offsets: dict[str, int]
    copy: str = "auto"   # the copy path (COPY_MODES)

    @classmethod
    def reserve(cls, buffer: ExtentBuffer, manifest: PayloadManifest, copy: str | None = None
                ) -> "StagingExtent | None":
        mode = copy_mode(copy)
        blocks = buffer.reserve(manifest.total_bytes)
        return None if blocks is None else cls(buffer, blocks, group_offsets(manifest), mode)

    def base(self, group: str) -> int:
        return self.buffer.address(self.blocks) + self.offsets[group]

    def rows(self, group: str, row_bytes: int, start: int, end: int) -> np.ndarray:
        """Rows [start, end) of the group, (end - start, row_bytes) uint8 view."""
        at = self.offsets[group] + start * row_bytes
        return self.buffer.bytes_of(self.blocks)[at:at + (end - start) * row_bytes].reshape(end - start, row_bytes)

    def copy_in(self, pool: RowPool, group: str, slots: np.ndarray, start: int, end: int) -> None:
        """Copy rows [start, end) of the group from their pool slots (on CPU pools numpy by default, not
        torch: torch's intra-op threads wait on a core the transport needs)."""
        if end > start:
            at = int(self.blocks[0]) * BLOCK + self.offsets[group] + start * pool.row_bytes
            gather_rows(pool.tensor, slots[start:end], self.buffer.pool.tensor, at, self.copy, group)

    def free(self) -> None:
        self.buffer.allocator.free(self.blocks)


def split_for_lanes(src: np.ndarray, dst: np.ndarray, lengths: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut entries longer than a lane's share (total / WRITE_PIECES, at least MIN_PIECE_BYTES) into
    equal pieces, so the transport moves them on all its lanes at once."""
    total = int(lengths.sum())
    piece = max(MIN_PIECE_BYTES, -(-total // WRITE_PIECES))
    if not len(lengths) or int(lengths.max()) <= piece:  # the common small write: nothing to cut
        return src, dst, lengths
    counts = -(-lengths.astype(np.int64) // piece)
    owner = np.repeat(np.arange(len(lengths)), counts)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)   # piece index in its entry
    size = np.repeat(-(-lengths.astype(np.int64) // counts), counts)              # equal cuts, the last shorter
    offset = k * size
    cut = np.minimum(size, lengths.astype(np.int64)[owner] - offset).astype(np.uint64)
    return src[owner] + offset.astype(np.uint64), dst[owner] + offset.astype(np.uint64), cut
