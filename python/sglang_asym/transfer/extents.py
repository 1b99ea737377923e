"""Staged transfers: a registered buffer on each side that holds a room's rows back to back,
groups in manifest order, so the wire sees a handful of large entries instead of one per run of
scattered pool slots.

Why: over Mooncake's TCP transport every write entry costs tens of microseconds (a request and
an acknowledgement on one of a few lanes per peer), so rows scattered over fragmented pools cost
far more than the same bytes in one piece (measured on 2 cores: a 342 KB payload in 18 entries
0.63 ms, as 4 entries 0.25-0.43 ms; 1.7 MB in 78 entries 2.7 ms, as 4 entries 0.8-1.3 ms).
- P copies the rows into its room's STAGING extent when send_rows hands them over (where it
  already sums their CRCs, off the transfer's critical path);
- D offers a LANDING extent instead of its pool slots, and the receiver reads the rows from
  there (Receiver.rows) until release(); P never learns D's pool addresses, so a late write can
  only reach a landing extent, which stays quarantined like pool slots.
Either side without a buffer (TransferConfig.staging_bytes / landing_bytes = 0), or without a
free extent for the room, moves that room directly, slot run by slot run.

Extents are counted in blocks of BLOCK bytes, so the slot bookkeeping (allocation, quarantine,
leak checks) treats a buffer as one more pool.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np
import torch

from sglang_asym.manifest import PayloadManifest
from sglang_asym.transfer.errors import SlotsExhaustedError
from sglang_asym.transfer.row_pool import RowPool

LANDING_POOL, STAGING_POOL = "landing", "staging"   # names in slot reports (never manifest group names)
BLOCK = 64                                          # bytes per block: extents start cache-line aligned


def group_offsets(manifest: PayloadManifest) -> dict[str, int]:
    """Byte offset of every group inside a room's extent (groups back to back, manifest order)."""
    offsets, at = {}, 0
    for g in manifest.groups:
        offsets[g.name] = at
        at += g.nbytes
    return offsets


class ExtentAllocator:
    """Contiguous runs of blocks, first fit over an address-ordered free list; freed runs merge
    with their neighbours. Same interface as SlotAllocator (allocate/free of slot arrays,
    capacity, num_free, check_consistent), so DecodeSlots can own it like any pool; every
    allocation is one run."""

    def __init__(self, name: str, capacity: int):
        if capacity <= 0:
            raise ValueError(f"ExtentAllocator {name!r}: capacity must be positive, got {capacity}")
        self.name, self.capacity = name, capacity
        self._starts, self._ends = [0], [capacity]   # free runs [start, end), sorted, never adjacent
        self._owned = np.zeros(capacity, dtype=bool)
        self._free = capacity
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        return self._free

    def allocate(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        with self._lock:
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            for i, (s, e) in enumerate(zip(self._starts, self._ends)):
                if e - s >= n:
                    break
            else:
                raise SlotsExhaustedError(f"pool {self.name!r}: no free run of {n} blocks "
                                          f"({self._free} of {self.capacity} free)")
            if e - s == n:
                del self._starts[i], self._ends[i]
            else:
                self._starts[i] = s + n
            self._owned[s:s + n] = True
            self._free -= n
            return np.arange(s, s + n, dtype=np.int64)

    def free(self, slots) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) == 0:
            return
        s, n = int(slots[0]), len(slots)
        with self._lock:
            if s < 0 or s + n > self.capacity or not np.array_equal(slots, np.arange(s, s + n)):
                raise ValueError(f"pool {self.name!r}: can only free one run inside [0, {self.capacity})")
            if not self._owned[s:s + n].all():
                raise ValueError(f"pool {self.name!r}: double free or free of a block never allocated")
            self._owned[s:s + n] = False
            self._free += n
            i = bisect.bisect_left(self._starts, s)
            merge_prev = i > 0 and self._ends[i - 1] == s
            merge_next = i < len(self._starts) and self._starts[i] == s + n
            if merge_prev and merge_next:
                self._ends[i - 1] = self._ends[i]
                del self._starts[i], self._ends[i]
            elif merge_prev:
                self._ends[i - 1] = s + n
            elif merge_next:
                self._starts[i] = s
            else:
                self._starts.insert(i, s)
                self._ends.insert(i, s + n)

    def check_consistent(self) -> None:
        with self._lock:
            free = np.zeros(self.capacity, dtype=bool)
            for a, (s, e) in enumerate(zip(self._starts, self._ends)):
                if not s < e or (a and self._ends[a - 1] >= s):
                    raise AssertionError(f"pool {self.name!r}: free runs out of order or adjacent")
                free[s:e] = True
            if (free & self._owned).any() or int(free.sum()) + int(self._owned.sum()) != self.capacity \
                    or int(free.sum()) != self._free:
                raise AssertionError(f"pool {self.name!r}: free runs and owned blocks disagree")


class ExtentBuffer:
    """One registered buffer and its extent allocator."""

    def __init__(self, name: str, nbytes: int):
        blocks = nbytes // BLOCK
        if blocks <= 0:
            raise ValueError(f"{name} buffer needs at least {BLOCK} bytes, got {nbytes}")
        # zeros, not empty: the pages are touched now (Mooncake's writes into untouched pages
        # ran ~1.5x slower here)
        self.pool = RowPool(name, torch.zeros((blocks, BLOCK), dtype=torch.uint8))
        self.allocator = ExtentAllocator(name, blocks)
        self._bytes = self.pool.array.reshape(-1)

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def base_ptr(self) -> int:
        return self.pool.base_ptr

    def reserve(self, nbytes: int) -> np.ndarray | None:
        """Blocks of one free extent of at least nbytes (> 0), or None when no run is free."""
        if nbytes <= 0:
            return None
        try:
            return self.allocator.allocate(-(-nbytes // BLOCK))
        except SlotsExhaustedError:
            return None

    def address(self, blocks: np.ndarray) -> int:
        return self.base_ptr + int(blocks[0]) * BLOCK

    def bytes_of(self, blocks: np.ndarray) -> np.ndarray:
        """The extent's bytes (a uint8 view)."""
        start = int(blocks[0]) * BLOCK
        return self._bytes[start:start + len(blocks) * BLOCK]
