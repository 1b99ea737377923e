"""P's side of staged transfers (extents.py says why): a room's staging extent, the copy of
rows into it as send_rows hands them over, and cutting the wire entries for the lanes.

A staged room's rows keep their place in the extent until the room is dropped (terminal and no
write task left), so a write never waits for a copy. A failed write can leave entries in flight
that read the extent after it was handed to another room: they can only land in the failed
room's destination, which D quarantines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.extents import ExtentBuffer, group_offsets
from sglang_asym.transfer.row_pool import RowPool

# Mooncake's TCP transport moves a request on one of MC_TCP_LANES_PER_PEER lanes (4 by default),
# its 64 KiB chunks one after another: a large write cut into that many pieces keeps every lane
# busy, while each extra entry of a small one costs more than it saves (measured on 2 cores, whole
# transfers: 342 KB as 1 entry 0.78 ms, as 4 entries 0.95 ms; 1.7 MB as 4 entries 1.39 ms, as 1 1.54 ms).
WRITE_PIECES = 4
MIN_PIECE_BYTES = 512 << 10


@dataclass(frozen=True)
class StagingExtent:
    """Where a room's rows sit in P's staging buffer: group g's row r at address(g) + r * row_bytes."""

    buffer: ExtentBuffer
    blocks: np.ndarray
    offsets: dict[str, int]

    @classmethod
    def reserve(cls, buffer: ExtentBuffer, manifest: PayloadManifest) -> "StagingExtent | None":
        blocks = buffer.reserve(manifest.total_bytes)
        return None if blocks is None else cls(buffer, blocks, group_offsets(manifest))

    def base(self, group: str) -> int:
        return self.buffer.address(self.blocks) + self.offsets[group]

    def rows(self, group: str, row_bytes: int, start: int, end: int) -> np.ndarray:
        """Rows [start, end) of the group, (end - start, row_bytes) uint8 view."""
        at = self.offsets[group] + start * row_bytes
        return self.buffer.bytes_of(self.blocks)[at:at + (end - start) * row_bytes].reshape(end - start, row_bytes)

    def copy_in(self, pool: RowPool, group: str, slots: np.ndarray, start: int, end: int) -> None:
        """Copy rows [start, end) of the group from their pool slots (numpy, not torch: torch's
        intra-op threads wait on a core the transport needs)."""
        if end > start:
            np.take(pool.array, slots[start:end], axis=0, out=self.rows(group, pool.row_bytes, start, end))

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
